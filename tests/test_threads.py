"""The engine's intra-op thread governor: the policy, and its reaction to other processes' CPU use."""

from __future__ import annotations

import torch

from omniduplex.pipeline.engine import threads as th


def test_pick_threads_leaves_the_cores_others_use():
    assert th.pick_threads(2, 2, 0.0) == 2
    assert th.pick_threads(2, 2, 0.2) == 2
    assert th.pick_threads(2, 2, 1.0) == 1  # one busy process on 2 cores
    assert th.pick_threads(2, 2, 0.8) == 1
    assert th.pick_threads(2, 2, 3.0) == 1  # never below 1
    assert th.pick_threads(8, 16, 2.0) == 8  # never above the configured count
    assert th.pick_threads(8, 8, 2.0) == 6


def test_governor_follows_a_competitor_and_restores_threads(monkeypatch):
    clock = {"t": 0.0, "host": 100.0, "own": 10.0}
    monkeypatch.setattr(th.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(th.time, "process_time", lambda: clock["own"])
    monkeypatch.setattr(th, "_host_busy_seconds", lambda: clock["host"])
    set_to = []
    monkeypatch.setattr(th.torch, "set_num_threads", set_to.append)
    g = th.ThreadGovernor(max_threads=2, num_cpus=2)
    assert g.enabled and g.update() == 2  # first reading: nothing to compare yet

    def advance(dt, ours, others):
        clock["t"] += dt
        clock["own"] += ours * dt
        clock["host"] += (ours + others) * dt

    advance(0.1, 1.5, 1.0)
    assert g.update() == 2 and set_to == []  # not due yet
    advance(0.5, 1.0, 1.0)  # a competitor keeps one core busy
    assert g.update() == 1 and set_to == [1]
    advance(0.6, 1.0, 0.9)
    assert g.update() == 1 and set_to == [1]  # unchanged: no call
    advance(0.6, 1.0, 0.05)  # it left
    assert g.update() == 2 and set_to == [1, 2] and g.num_changes == 2


def test_governor_is_off_for_one_thread():
    g = th.ThreadGovernor(max_threads=1, num_cpus=2)
    assert not g.enabled and g.update() == 1 and torch.get_num_threads() >= 1
