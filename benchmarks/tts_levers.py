"""``omniduplex bench tts --model DIR`` for the families with a serving lever: the family's own benchmark
module (:mod:`.tts_voxcpm2`, :mod:`.tts_higgs`, :mod:`.tts_fish`; its ``bench``, declared with the family in
:mod:`omniduplex.pipeline.speech.registry`) run with the lever on and off, one table of TTFP, RTF and
audio-s/s per concurrency with the seed's figure beside it (vLLM-Omni on an H20, real weights) and the
lever's own counter: VoxCPM2 flow-matching solver calls per step, Higgs host time of the decode state per
step (ms), Fish slow-AR decode attention per step (ms).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def common_rows(got: list[dict], counter_key: str) -> list[dict]:
    """``measure`` rows in the common keys of :func:`lever_bench` (``c``, ``ttfp_ms_p50``, ``rtf`` from
    ``rtf_p50``, ``audio_s_per_s``, ``counter`` from ``counter_key``), each keeping its row as ``detail``."""
    return [
        dict(
            c=r["c"],
            ttfp_ms_p50=r["ttfp_ms_p50"],
            rtf=r["rtf_p50"],
            audio_s_per_s=r["audio_s_per_s"],
            counter=r[counter_key],
            detail=r,
        )
        for r in got
    ]


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
