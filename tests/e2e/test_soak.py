"""A short run of ``omniduplex bench soak`` (the full one runs 1,000 turns): WebRTC and Realtime API clients
with random barge-ins and vanishing clients while stage processes are SIGKILLed; nothing may leak and no turn
may fail outside the kill windows."""

from __future__ import annotations

import pytest

from omniduplex.benchmarks.soak import run

pytestmark = pytest.mark.slow


def test_short_soak_leaks_nothing_and_loses_no_turn_outside_kill_windows():
    r = run(turns=16, sessions=4, kill_every=8, model=None, seed=1, json_out=None)
    assert r["turns"] == 16 and r["stage_kills"] == 2
    # the second kill comes with the last turn: leaks are counted once that stage is back, not while it loads
    assert r["idle_and_ready_at_end"], r
    assert r["failed_outside_kill_windows"] == 0, r
    leaks = r["leaks"]
    assert leaks["shm_segments"] == 0 and leaks["asyncio_tasks"] <= 0 and leaks["turns_in_flight"] == 0
    assert leaks["kv_blocks"] == 0 and leaks["relay_slots"] == 0
    assert leaks["fds"]["server"] <= 0, leaks["fds"]
