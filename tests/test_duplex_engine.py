"""The duplex frame engine (pipeline/duplex/): many sessions of a Moshi-architecture model (tiny preset,
random weights) advanced one 80 ms frame per tick in one batched step. A session's output in a batch equals
its output alone; joins, leaves (row compaction) and other sessions' sampling settings do not change it; the
CPU twin of the CUDA-graph path equals the eager path; underruns and overruns are counted and told; bad
input is refused with a clear error while the others keep running."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omniduplex.models.moshi.checkpoint import MoshiModels, random_models
from omniduplex.models.moshi.config import FRAME_SAMPLES
from omniduplex.pipeline.duplex.engine import DuplexEngine
from omniduplex.pipeline.duplex.slots import DuplexSettings

GREEDY = DuplexSettings(temp_text=0.0, temp_audio=0.0)
TICKS = 8


def _engine(**kw) -> DuplexEngine:
    lm, mimi = random_models("tiny", 0)
    return DuplexEngine(MoshiModels(lm, mimi, {}), **kw)


def _voice(seed: int, ticks: int = TICKS) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [(0.3 * g.standard_normal(FRAME_SAMPLES)).astype(np.float32) for _ in range(ticks)]


def _solo(seed: int, ticks: int = TICKS) -> list:
    eng = _engine(capacity=2)
    eng.join("a", GREEDY)
    out = []
    for pcm in _voice(seed, ticks):
        eng.push("a", pcm)
        out.append(eng.tick()[0])
    return out


def _same(got, want) -> None:
    assert [f.text_token for f in got] == [f.text_token for f in want]
    for g, w in zip(got, want):
        assert np.abs(g.pcm - w.pcm).max() <= 1e-5


def test_batched_sessions_match_solo_runs():
    solo = {s: _solo(s) for s in (1, 2, 3)}
    eng = _engine(capacity=4)
    for s in (1, 2, 3):
        eng.join(str(s), GREEDY)
    voices = {s: _voice(s) for s in (1, 2, 3)}
    got = {s: [] for s in (1, 2, 3)}
    for t in range(TICKS):
        for s in (1, 2, 3):
            eng.push(str(s), voices[s][t])
        frames = eng.tick()
        assert len(frames) == 3
        for f in frames:
            got[int(f.session_id)].append(f)
    for s in (1, 2, 3):
        _same(got[s], solo[s])
        assert got[s][0].text_token is None and not got[s][0].pcm.any()  # the acoustic delay's first frame
        assert np.abs(got[s][-1].pcm).max() > 1e-3
    assert np.abs(got[1][-1].pcm - got[2][-1].pcm).max() > 1e-4  # what a session hears matters


def test_join_leave_and_sampling_neighbours_do_not_change_a_session():
    want = _solo(5, 10)
    eng = _engine(capacity=4)
    eng.join("b", DuplexSettings(temp_text=1.0, temp_audio=1.0))  # row 0, sampled
    eng.join("a", GREEDY)  # row 1, moves to row 0 when b leaves
    voice, other = _voice(5, 10), _voice(9, 10)
    got = []
    for t in range(10):
        if t == 4:
            eng.leave("b")
        if t == 6:
            eng.join("c", DuplexSettings(temp_text=0.9, top_k_text=3))
        eng.push("a", voice[t])
        if t < 4:
            eng.push("b", other[t])
        frames = {f.session_id: f for f in eng.tick()}
        assert ("b" in frames) == (t < 4) and ("c" in frames) == (t >= 6)
        got.append(frames["a"])
    _same(got, want)
    assert eng.slots.order == ["a", "c"]
    assert eng.stats("c")["input_underruns"] == 4  # c never sent audio: it heard silence, counted


def test_cpu_twin_of_the_graphed_step_equals_eager():
    eager, twin = _engine(capacity=4), _engine(capacity=4, graph_mode="twin")
    assert twin.runner is not None and sorted(twin.runner.graphs) == [1, 2, 4]
    for eng in (eager, twin):
        for s in ("x", "y", "z"):
            eng.join(s, GREEDY)
    for vx, vy in zip(_voice(1), _voice(2)):
        res = []
        for eng in (eager, twin):
            eng.push("x", vx)
            eng.push("y", vy)
            res.append(eng.tick())
        _same(res[1], res[0])
    assert twin.runner.hits == TICKS  # 3 rows padded to bucket 4 every tick


def test_overrun_is_counted_and_told_to_every_session():
    eng = _engine(capacity=2, budget_ms=0.0)  # every tick is over a zero budget
    eng.join("a")
    eng.join("b")
    for _ in range(3):
        frames = eng.tick()
        assert all(f.overrun for f in frames) and len(frames) == 2
    assert eng.overrun_ticks == 3 and eng.stats("a")["overruns"] == 3
    events = eng.events("b")
    assert [e["type"] for e in events] == ["tick_overrun"] * 3 and events[0]["budget_ms"] == 0.0
    assert eng.events("b") == []


def test_bad_input_is_refused_and_others_keep_running():
    eng = _engine(capacity=2)
    eng.join("a", GREEDY)
    eng.join("b", GREEDY)
    with pytest.raises(ValueError, match="1920 samples"):
        eng.push("a", np.zeros(1000, dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        eng.push("a", np.full(FRAME_SAMPLES, np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="unknown session"):
        eng.push("zz", np.zeros(FRAME_SAMPLES, dtype=np.float32))
    with pytest.raises(ValueError, match="full"):
        eng.join("c")
    with pytest.raises(ValueError, match="already joined"):
        eng.join("a")
    eng.push("b", _voice(3)[0])
    frames = eng.tick()
    assert [f.session_id for f in frames] == ["a", "b"]
    stats = eng.stats("a")
    assert stats["frames"] == 1 and stats["input_underruns"] == 1 and eng.stats("b")["input_underruns"] == 0


def test_sampling_settings_are_per_row_tensors():
    eng = _engine(capacity=4)
    eng.join("hot", DuplexSettings(temp_text=1.5, top_k_text=7, temp_audio=1.0, top_k_audio=5))
    eng.join("cold", GREEDY)
    eng.tick()
    s = eng.settings
    assert s.temp_text[:2].tolist() == [1.5, 0.0] and s.top_k_text[:2].tolist() == [7, 25]
    assert s.top_k_audio[:2].tolist() == [5, 250]
    assert isinstance(s.temp_text, torch.Tensor)


def test_clock_ticks_on_its_thread_while_sessions_join_and_leave():
    import threading
    import time

    from omniduplex.pipeline.duplex.clock import DuplexClock

    eng = _engine(capacity=3)
    got: dict[str, list] = {}
    seen = threading.Event()

    def on_frames(frames):
        for f in frames:
            got.setdefault(f.session_id, []).append(f.tick)
        if len(got.get("b", [])) >= 3:
            seen.set()

    clock = DuplexClock(eng, on_frames)
    eng.join("a", GREEDY)
    clock.start()
    try:
        for pcm in _voice(4, 3):
            eng.push("a", pcm)
        eng.join("b", GREEDY)  # from this thread while the clock ticks
        assert seen.wait(60)
        eng.leave("a")
        deadline = time.monotonic() + 60
        while "a" in eng.slots.sessions and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        clock.stop()
    assert "a" not in eng.slots.sessions and clock.errors == 0
    for ticks in got.values():  # every tick reached every session once, in order
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))
    assert got["b"][0] > got["a"][0]
