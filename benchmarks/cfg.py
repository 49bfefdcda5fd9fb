"""``omniduplex bench cfg``: audio-frame throughput with CFG (paired co-scheduling) vs without, same model.

``c`` concurrent turns (random 16-token prompts, speech from the first step: ``max_text_tokens=0``,
``frames`` codec frames each, greedy) run to completion in the engine; throughput = codec frames
emitted ÷ wall seconds. With CFG every turn brings its null-prompt companion into the same batch and
forward, so the batch holds 2c rows; the ratio CFG / no-CFG is the figure of merit (OpusLM reports
~80% with co-scheduling). The two modes' engines run interleaved step by step, each step timed and
charged to its mode (:func:`interleaved_frames_per_second`), for ``repeats`` rounds; each mode reports
its median, so a noisy neighbour on a shared machine skews both alike.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import torch

from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.unified_adapter import UnifiedAdapter


def _engine(lm, c: int, frames: int, cfg_scale: float, text_tokens: int = 0) -> Engine:
    """An engine holding ``c`` fresh turns (random 16-token prompts; up to ``text_tokens`` text tokens,
    then ``frames`` codec frames)."""
    adapter = UnifiedAdapter(lm, max_len=frames + text_tokens + 64)
    engine = Engine(
        adapter,
        num_blocks=4 * c * ((frames + text_tokens) // 16 + 4),
        max_num_seqs=c,
        max_num_batched_tokens=4096,
        dtype=lm.lm_head.weight.dtype,
    )
    rng = random.Random(0)
    for i in range(c):
        prompt = [rng.randrange(1, 200) for _ in range(16)]
        engine.add_request(adapter.make_request(f"r{i}", prompt, text_tokens, frames, cfg_scale))
    return engine


def interleaved_frames_per_second(
    lm, c: int, frames: int, cfg_scales: list[float], text_tokens: int = 0
) -> list[float]:
    """Codec frames/s of each mode, its engine stepped in turn with the others' (one step each per round).

    Every step is timed on its own and charged to its mode, so slow phases of a shared machine (noisy
    neighbours, frequency changes) fall on all modes alike instead of on whichever ran then.
    """
    engines = [_engine(lm, c, frames, w, text_tokens) for w in cfg_scales]
    spent, produced = [0.0] * len(engines), [0] * len(engines)
    with torch.no_grad():
        while any(e.has_unfinished() for e in engines):
            for k, e in enumerate(engines):
                if e.has_unfinished():
                    t0 = time.perf_counter()
                    outs = e.step()
                    spent[k] += time.perf_counter() - t0
                    produced[k] += sum("codes" in o.extras for o in outs)
    return [n / t for n, t in zip(produced, spent)]


def run(
    model_dir: Path,
    c: int,
    frames: int,
    cfg_scale: float,
    json_out: Path | None,
    threads: int = 2,
    dtype: str = "bfloat16",
    repeats: int = 5,
    text_tokens: int = 0,
) -> dict:
    """Measure both modes (interleaved, ``repeats`` rounds, medians) and print the table.

    ``dtype``: ``float32`` or ``bfloat16`` (weights and KV cache). ``text_tokens``: text budget of each
    turn before it must speak (0 = speech from the first step: pure audio-phase throughput; with text
    first, the lazy companion runs only from the audio phase on). Returns the figures.
    """
    torch.set_num_threads(threads)
    lm = load_model(model_dir, parts=("unified",), dtype=getattr(torch, dtype)).unified
    interleaved_frames_per_second(lm, c, 4, [1.0, cfg_scale])  # first-call kernel setup off the clock
    plain, guided = [], []
    for _ in range(repeats):
        p, g = interleaved_frames_per_second(lm, c, frames, [1.0, cfg_scale], text_tokens)
        plain.append(p)
        guided.append(g)
    p, g = statistics.median(plain), statistics.median(guided)
    res = {
        "c": c,
        "frames": frames,
        "cfg_scale": cfg_scale,
        "dtype": dtype,
        "text_tokens": text_tokens,
        "threads": threads,
        "no_cfg_frames_per_s": p,
        "cfg_frames_per_s": g,
        "ratio": g / p,
        "no_cfg_runs": plain,
        "cfg_runs": guided,
    }
    print(
        f"\ncfg benchmark: {model_dir}  c={c}, ≤{text_tokens} text tokens then {frames} frames per turn, "
        f"greedy, {dtype}, {threads} threads, median of {repeats}"
    )
    print("| mode | audio frames/s | vs no-CFG |")
    print("|---|---|---|")
    print(f"| no CFG | {p:.1f} | 100% |")
    print(f"| CFG w={cfg_scale} (paired) | {g:.1f} | {100 * g / p:.0f}% |")
    if json_out:
        json_out.write_text(json.dumps(res, indent=2))
    return res
