"""``omniduplex bench tts --model DIR`` for the engine families: the family read from the checkpoint's
``config.json``, its own benchmark module run with the serving lever on and off (each module's figures and
terms: :mod:`.tts_voxcpm2`, :mod:`.tts_higgs`, :mod:`.tts_fish`), one table of TTFP, RTF and audio-s/s per
concurrency with the seed's figure beside it (vLLM-Omni on an H20, real weights) and the lever's own
counter: VoxCPM2 flow-matching solver calls per step, Higgs host time of the decode state per step (ms),
Fish slow-AR decode attention per step (ms).
"""

from __future__ import annotations

import json
from pathlib import Path

from omniduplex.models.tts_family import FISH_SPEECH, HIGGS, VOXCPM2, tts_family

SEED = {
    VOXCPM2: {64: "33.07 audio-s/s"},
    HIGGS: {16: "35.26 audio-s/s"},
    FISH_SPEECH: {64: "23.72 audio-s/s, TTFP 900 ms"},
}
"""The seed's figures by family and concurrency (issue 34: vLLM-Omni, H20)."""
COUNTER = {
    VOXCPM2: ("solver calls/step", "solver_calls_per_step"),
    HIGGS: ("state ms/step", "state_ms_per_step"),
    FISH_SPEECH: ("slow-AR attn ms/step", "slow_attn_ms_per_step"),
}


def _rows(family: str, model_dir: Path, levels: tuple[int, ...], lever: bool, threads: int) -> list[dict]:
    """One family module's :func:`measure` rows, in common keys (``c``, ``ttfp_ms_p50``, ``rtf``,
    ``audio_s_per_s``, ``counter``)."""
    if family == VOXCPM2:
        from omniduplex.benchmarks.tts_voxcpm2 import measure

        rows = measure(model_dir, levels, lever=lever, threads=threads)["rows"]
    elif family == HIGGS:
        import torch

        from omniduplex.benchmarks.tts_higgs import measure

        torch.set_num_threads(threads)
        rows = measure(model_dir, levels, lever=lever)["levels"]
    else:
        from omniduplex.benchmarks.tts_fish import measure

        rows = measure(model_dir, levels, lever=lever, threads=threads)["rows"]
    key = COUNTER[family][1]
    return [
        {
            "family": family,
            "lever": lever,
            "c": r.get("c", r.get("concurrency")),
            "ttfp_ms_p50": r["ttfp_ms_p50"],
            "rtf": r.get("rtf_p50", r.get("rtf_mean")),
            "audio_s_per_s": r["audio_s_per_s"],
            "counter": r[key],
            "detail": r,
        }
        for r in rows
    ]


def run(model_dir: Path, levels: list[int], threads: int = 2, json_out: Path | None = None) -> list[dict]:
    """Measure ``model_dir`` at every level with the lever on, then off; print the table; return the rows.

    Raises ValueError: not a VoxCPM2, Higgs or Fish Speech checkpoint."""
    family = tts_family(model_dir)
    if family not in SEED:
        raise ValueError(f"{model_dir}: not a VoxCPM2, Higgs or Fish Speech checkpoint")
    rows = []
    for lever in (True, False):
        rows += _rows(family, Path(model_dir), tuple(levels), lever, threads)
    name = COUNTER[family][0]
    print(f"\n{family} bench: {model_dir}, {threads} threads, in-process engine + streaming decoder (CPU)")
    print(f"| lever | c | TTFP p50 ms | RTF | audio s/s | {name} | seed (H20) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        seed = SEED[family].get(r["c"], "")
        print(
            f"| {'on' if r['lever'] else 'off'} | {r['c']} | {r['ttfp_ms_p50']:.0f} | {r['rtf']:.2f} "
            f"| {r['audio_s_per_s']:.2f} | {r['counter']:.2f} | {seed} |",
            flush=True,
        )
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2, default=str))
    return rows
