"""Freed heap memory goes back to the OS after a session ends, at most once a second."""

from __future__ import annotations

import ctypes.util

from omniduplex.app.host import heap


def test_trim_runs_on_glibc_and_is_rate_limited(monkeypatch):
    monkeypatch.setattr(heap, "_last", 0.0)
    ran = heap.release_free_memory()
    assert ran == bool(ctypes.util.find_library("c"))  # glibc here: it ran
    assert heap.release_free_memory() is False  # within MIN_INTERVAL_S: skipped
    monkeypatch.setattr(heap, "_last", heap._last - heap.MIN_INTERVAL_S)
    assert heap.release_free_memory() is ran
