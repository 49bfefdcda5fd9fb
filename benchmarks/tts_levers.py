"""``omniduplex bench tts --model DIR`` for the families with a serving lever: the family's own benchmark
module (:mod:`.tts_voxcpm2`, :mod:`.tts_higgs`, :mod:`.tts_fish`; its ``bench``, declared with the family in
:mod:`omniduplex.pipeline.speech.registry`) run with the lever on and off, one table of TTFP, RTF and
audio-s/s per concurrency with the seed's figure beside it (vLLM-Omni on an H20, real weights) and the
lever's own counter: VoxCPM2 flow-matching solver calls per step, Higgs host time of the decode state per
step (ms), Fish slow-AR decode attention per step (ms).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def fixed_length(frames: int, seed: int = 0, **sampling: Any) -> Callable[[int], dict]:
    """Sampling params of utterance ``i`` in a throughput run: ``frames`` + 1 steps whatever the model
    samples (``ignore_eos``: random-weight presets never stop on their own), seed ``seed + i``; ``sampling``
    adds or overrides keys."""
    return lambda i: {"max_tokens": frames + 1, "ignore_eos": True, "seed": seed + i, **sampling}


def timed_steps(engine: Any, prompts: list, sampling: Callable[[int], dict]) -> Iterator[tuple[list, float]]:
    """Admit every prompt at once (request ids ``u0``, ``u1``, ...; ``sampling(i)`` the params of the
    ``i``-th), then step ``engine`` until nothing is unfinished, yielding each step's events with the
    seconds (wall clock) that ``engine.step()`` took."""
    for i, p in enumerate(prompts):
        engine.add(f"u{i}", p, sampling(i))
    while engine.has_unfinished():
        ts = time.perf_counter()
        events = engine.step()
        yield events, time.perf_counter() - ts


def stream_figures(first: list[float], last: list[float], audio: list[float], wall: float) -> dict:
    """One level's latency and throughput from per-utterance seconds since the level started: ``first``
    (first audio piece out) and ``last`` (last piece), ``audio`` (seconds of audio made) and the level's
    ``wall`` seconds. Keys: ``ttfp_ms_p50`` / ``ttfp_ms_max`` (ms), ``rtf_p50`` (last piece time / audio
    length, median), ``audio_s_per_s`` (all audio / wall), ``wall_s``."""
    return {
        "ttfp_ms_p50": 1000 * statistics.median(first),
        "ttfp_ms_max": 1000 * max(first),
        "rtf_p50": statistics.median(t / a for t, a in zip(last, audio)),
        "audio_s_per_s": sum(audio) / wall,
        "wall_s": wall,
    }


def common_rows(
    got: list[dict], counter_key: str, c_key: str = "c", rtf_key: str = "rtf_p50"
) -> list[dict]:
    """``measure`` rows in the common keys of :func:`lever_bench` (``c`` from ``c_key``, ``ttfp_ms_p50``,
    ``rtf`` from ``rtf_key``, ``audio_s_per_s``, ``counter`` from ``counter_key``), each keeping its row as
    ``detail``."""
    return [
        dict(
            c=r[c_key],
            ttfp_ms_p50=r["ttfp_ms_p50"],
            rtf=r[rtf_key],
            audio_s_per_s=r["audio_s_per_s"],
            counter=r[counter_key],
            detail=r,
        )
        for r in got
    ]


def measured_rows(
    measure: Callable[..., dict], model_dir: Path, levels: list[int], threads: int, counter_key: str
) -> Callable[[bool], list[dict]]:
    """The ``rows(lever)`` of :func:`lever_bench` for a family module whose ``measure(model_dir, levels,
    lever=, threads=)`` returns ``{"rows": [...]}`` in the keys :func:`common_rows` reads by default."""
    return lambda lever: common_rows(
        measure(model_dir, tuple(levels), lever=lever, threads=threads)["rows"], counter_key
    )


def lever_bench(
    family: str,
    model_dir: Path,
    rows: Callable[[bool], list[dict]],
    counter: str,
    seed: dict[int, str],
    threads: int,
    json_out: Path | None = None,
) -> list[dict]:
    """Measure with the lever on, then off (``rows(lever)``: the family module's rows in common keys
    ``c``, ``ttfp_ms_p50``, ``rtf``, ``audio_s_per_s``, ``counter``); print the table with the lever's
    ``counter`` and the ``seed``'s figure per concurrency; write ``json_out``; return the rows."""
    out = []
    for lever in (True, False):
        out += [{"family": family, "lever": lever, **r} for r in rows(lever)]
    print(f"\n{family} bench: {model_dir}, {threads} threads, in-process engine + streaming decoder (CPU)")
    print(f"| lever | c | TTFP p50 ms | RTF | audio s/s | {counter} | seed (H20) |")
    print("|---|---|---|---|---|---|---|")
    for r in out:
        print(
            f"| {'on' if r['lever'] else 'off'} | {r['c']} | {r['ttfp_ms_p50']:.0f} | {r['rtf']:.2f} "
            f"| {r['audio_s_per_s']:.2f} | {r['counter']:.2f} | {seed.get(r['c'], '')} |",
            flush=True,
        )
    if json_out:
        json_out.write_text(json.dumps(out, indent=2, default=str))
    return out
