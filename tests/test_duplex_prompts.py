"""PersonaPlex-style voice and role prompts in the duplex frame engine (pipeline/duplex/prompts.py), on the
tiny Moshi preset with random weights, greedy: a prompt changes what the model says, the same prompt gives the
same output every time, the prompt's own frames are not sent, and sessions with different prompts in one
batch (prefills overlapping other sessions' live ticks) each equal their run alone, in the eager step and in
the CPU twin of the graphed one."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from omniduplex.models.moshi.checkpoint import MoshiModels, random_models
from omniduplex.models.moshi.config import FRAME_SAMPLES
from omniduplex.pipeline.duplex.engine import DuplexEngine
from omniduplex.pipeline.duplex.prompts import DuplexPrompt, encode_voice_prompt, prompt_schedule
from omniduplex.pipeline.duplex.slots import DuplexSettings

GREEDY = DuplexSettings(temp_text=0.0, temp_audio=0.0)
TICKS = 14


def _models() -> MoshiModels:
    lm, mimi = random_models("tiny", 0)
    return MoshiModels(lm, mimi, {})


def _engine(**kw) -> DuplexEngine:
    return DuplexEngine(_models(), **kw)


def _voice(seed: int, ticks: int = TICKS) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [(0.3 * g.standard_normal(FRAME_SAMPLES)).astype(np.float32) for _ in range(ticks)]


def _clip_prompt(seed: int, role: list[int]) -> DuplexPrompt:
    """A voice prompt from a reference clip (0.4 s of noise through a non-streaming Mimi) and role tokens."""
    mimi = copy.deepcopy(_models().mimi)
    g = np.random.default_rng(100 + seed)
    clip = torch.from_numpy((0.3 * g.standard_normal(5 * FRAME_SAMPLES)).astype(np.float32))
    codes = encode_voice_prompt(mimi, clip, 8)
    assert codes.shape == (5, 8) and codes.dtype == torch.long
    return DuplexPrompt(codes, role)


def _run(eng: DuplexEngine, plan: dict[str, tuple[int, DuplexPrompt | None, int]], ticks: int = TICKS):
    """``plan``: session → (join tick, prompt, voice seed); every session pushes its voice each tick from its
    join on. Returns each session's frames."""
    voices = {s: _voice(seed) for s, (_, _, seed) in plan.items()}
    got = {s: [] for s in plan}
    for t in range(ticks):
        for s, (start, prompt, _) in plan.items():
            if t == start:
                eng.join(s, GREEDY, prompt)
            if t >= start:
                eng.push(s, voices[s][t - start])
        for f in eng.tick():
            got[f.session_id].append(f)
    return got


def _same(got, want) -> None:
    assert [f.text_token for f in got] == [f.text_token for f in want]
    for g, w in zip(got, want):
        assert np.abs(g.pcm - w.pcm).max() <= 1e-5


def test_schedule_applies_the_acoustic_delays():
    codes = torch.arange(16).reshape(2, 8)
    sched = prompt_schedule(DuplexPrompt(codes, [7]), [0, 0, 1, 1, 1, 1, 1, 1, 1], 8, pad_id=3)
    assert sched.shape == (4, 9)  # 3 prompt frames + max delay 1
    assert sched[:, 0].tolist() == [3, 3, 7, -1]  # text: padding under the voice, then the role token
    assert sched[:, 1].tolist() == [0, 8, -1, -1]  # codebook 0 (delay 0)
    assert sched[:, 2].tolist() == [-1, 1, 9, -1]  # codebook 1 (delay 1): frame i at step i + 1


def test_a_prompt_changes_the_output_deterministically_and_its_frames_are_not_sent():
    prompt = _clip_prompt(1, [5, 17, 42])
    plain = _run(_engine(capacity=2), {"a": (0, None, 1)})["a"]
    first = _run(_engine(capacity=2), {"a": (0, prompt, 1)})["a"]
    again = _run(_engine(capacity=2), {"a": (0, prompt, 1)})["a"]
    _same(again, first)  # greedy: the same prompt, the same output
    steps = prompt.frames + 1  # prefill ticks: the prompt frames plus the largest acoustic delay
    assert all(f.text_token is None and not f.pcm.any() for f in first[:steps])
    live = first[steps:]
    assert live and all(f.text_token is not None for f in live)
    plain_live = plain[1 : 1 + len(live)]
    assert [f.text_token for f in live] != [f.text_token for f in plain_live]
    role_only = _run(_engine(capacity=2), {"a": (0, DuplexPrompt(None, [5, 17, 42]), 1)})["a"]
    voice_only = _run(_engine(capacity=2), {"a": (0, DuplexPrompt(prompt.voice_codes, []), 1)})["a"]
    assert [f.text_token for f in role_only[4:]] != [f.text_token for f in plain[1 : len(role_only) - 3]]
    assert [f.text_token for f in voice_only[6:]] != [f.text_token for f in plain[1 : len(voice_only) - 5]]


@pytest.mark.parametrize("graph_mode", ["off", "twin"])
def test_sessions_with_different_prompts_in_one_batch_equal_each_alone(graph_mode):
    pa, pb = _clip_prompt(1, [5, 17]), _clip_prompt(2, [40])
    # b's prefill overlaps a's and c's live ticks
    plan = {"a": (0, pa, 1), "b": (3, pb, 2), "c": (1, None, 3)}
    batch = _run(_engine(capacity=4, graph_mode=graph_mode), plan)
    for s, (start, prompt, seed) in plan.items():
        alone = _run(_engine(capacity=4), {s: (start, prompt, seed)})[s]
        _same(batch[s], alone)
    assert [f.text_token for f in batch["a"]] != [f.text_token for f in batch["b"]][: len(batch["a"])]


def test_bad_prompts_are_refused_with_a_clear_error():
    eng = _engine(capacity=2)
    with pytest.raises(ValueError, match="int64"):
        eng.join("x", GREEDY, DuplexPrompt(torch.zeros(3, 4, dtype=torch.long)))
    with pytest.raises(ValueError, match="role prompt tokens"):
        eng.join("x", GREEDY, DuplexPrompt(None, [10**9]))
    with pytest.raises(ValueError, match="longer than"):
        eng.join("x", GREEDY, DuplexPrompt(None, [1] * 300))
    with pytest.raises(ValueError, match="NaN"):
        encode_voice_prompt(copy.deepcopy(eng.mimi), torch.tensor([float("nan")] * 10), 8)
    eng.join("x", GREEDY)  # nothing was joined by the refused calls
    assert len(eng.tick()) == 1


def test_bench_duplex_prompts_times_both_kinds_of_extra_row():
    from omniduplex.benchmarks.duplex_prompts import measure

    times = measure("tiny", sessions=1, ticks=4, prompt_frames=2, block=2, full_context=False)
    assert {k: len(v) for k, v in times.items()} == {"plain": 4, "prefill": 4}
    assert all(t > 0 for v in times.values() for t in v)
