"""``omniduplex bench duplex-prompts``: does a joining session's voice / role prompt prefill move the other
sessions' tick time? (:mod:`omniduplex.pipeline.duplex.prompts`: one prompt frame per tick, forced inside
the same batched step.)

One engine holds ``sessions`` steady sessions fed 80 ms frames plus one more row that is, by turns:

* ``plain``: a session without a prompt (live, generating);
* ``prefill``: a session always reading a prompt (``prompt_frames`` frames; when its prefill ends it leaves
  and a new prompted session joins, so every timed tick has a prefill in it).

Both have the same number of rows, so the difference is the prefill itself. The two run in alternating
blocks of ``block`` ticks (machine noise hits both alike); tick p50 / p99 (ms, wall) are over all ticks of
each kind after warm-up. Random weights (``preset``), fp32, attention over the whole context window when
``full_context`` (the steady-state cost, as ``bench duplex``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from omniduplex.models.moshi.checkpoint import MoshiModels, random_models
from omniduplex.models.moshi.config import FRAME_SAMPLES
from omniduplex.models.moshi.transformer import Attention
from omniduplex.pipeline.duplex.engine import DuplexEngine
from omniduplex.pipeline.duplex.prompts import DuplexPrompt


def _p(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def measure(
    preset: str = "small",
    sessions: int = 4,
    ticks: int = 60,
    prompt_frames: int = 25,
    block: int = 10,
    full_context: bool = True,
) -> dict[str, list[float]]:
    """Tick wall times (ms) of each kind: ``{"plain": [...], "prefill": [...]}`` (see the module docstring).

    Raises ValueError for ``sessions < 1`` or ``prompt_frames < 1``."""
    if sessions < 1 or prompt_frames < 1:
        raise ValueError("sessions and prompt_frames must be >= 1")
    lm, mimi = random_models(preset, 0)
    # one row spare: a leave is applied at the next tick, the join that replaces it is queued before
    eng = DuplexEngine(MoshiModels(lm, mimi, {}), capacity=sessions + 2)
    if full_context:
        for m in (*lm.modules(), *mimi.modules()):
            if isinstance(m, Attention):
                m.fixed_window = True
    g = np.random.default_rng(0)
    voice = (0.3 * g.standard_normal(FRAME_SAMPLES)).astype(np.float32)
    steady = [f"s{i}" for i in range(sessions)]
    for s in steady:
        eng.join(s)
    codes = torch.from_numpy(g.integers(0, lm.card, (prompt_frames, lm.dep_q))).long()
    prompt = DuplexPrompt(codes, [])
    times: dict[str, list[float]] = {"plain": [], "prefill": []}
    extra, n_extra = None, 0

    def swap(kind: str) -> str:
        nonlocal extra, n_extra
        if extra is not None:
            eng.leave(extra)
        n_extra += 1
        extra = f"x{n_extra}"
        eng.join(extra, None, prompt if kind == "prefill" else None)
        return extra

    for _ in range(3):  # warm-up
        for s in steady:
            eng.push(s, voice)
        eng.tick()
    kinds = ["plain", "prefill"] * (-(-ticks // block))
    for kind in kinds:
        swap(kind)
        left = prompt_frames + eng.lag
        for _ in range(block):
            if kind == "prefill" and left == 0:
                swap(kind)
                left = prompt_frames + eng.lag
            for s in (*steady, extra):
                eng.push(s, voice)
            t0 = time.perf_counter()
            eng.tick()
            times[kind].append((time.perf_counter() - t0) * 1000)
            left -= 1
    return times


def run(preset: str, sessions: int, ticks: int, prompt_frames: int, threads: int, full_context: bool) -> dict:
    """Measure and print the table; returns ``{kind: {"p50_ms", "p99_ms", "ticks"}}``."""
    torch.set_num_threads(threads)
    times = measure(preset, sessions, ticks, prompt_frames, full_context=full_context)
    out = {k: {"p50_ms": _p(v, 50), "p99_ms": _p(v, 99), "ticks": len(v)} for k, v in times.items()}
    print(
        f"duplex prompt prefill: preset {preset}, {sessions} steady sessions + 1 row, "
        f"{prompt_frames}-frame prompts, {threads} thread(s), full context {full_context}"
    )
    print(f"{'extra row':<12}{'ticks':>7}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for k, v in times.items():
        print(f"{k:<12}{len(v):>7}{_p(v, 50):>10.1f}{_p(v, 99):>10.1f}{statistics.fmean(v):>10.1f}")
    return out
