"""``omniduplex bench serve``: a concurrency sweep of spoken turns through the whole pipeline.

For each ``c`` in the sweep, ``c`` turns (built from the speech WAVs given, cycled) are submitted at
once, ``rounds`` times; per turn we record TTFP (submit → first PCM chunk), E2EL (submit → done),
RTF (E2EL ÷ audio seconds) and audio seconds. Audio throughput = audio seconds generated ÷ wall
seconds of the round, summed over the concurrent turns.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np

from omniduplex.app.respond import serving_meta
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.topology import output_rate


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def _sweep(orch: Orchestrator, wavs: list[np.ndarray], concurrency: list[int], rounds: int, meta: dict):
    results = {}
    # warm-up turn (first-use allocations, lazy imports)
    rid = orch.submit(wavs[0], meta)
    async for _ in orch.events(rid):
        pass
    for c in concurrency:
        turns, audio_total, wall_total, errors = [], 0.0, 0.0, 0
        for r in range(rounds):
            t0 = time.perf_counter()
            ids = [orch.submit(wavs[(r * c + i) % len(wavs)], meta) for i in range(c)]

            async def one(rid):
                async for ev in orch.events(rid):
                    if ev.kind == "done":
                        return ev.metrics
                    if ev.kind == "error":
                        return None

            done = await asyncio.gather(*(one(i) for i in ids))
            wall_total += time.perf_counter() - t0
            for m in done:
                if m is None:
                    errors += 1
                else:
                    turns.append(m)
                    audio_total += m["audio_s"]
        ttfp = [m["ttfp_ms"] for m in turns]
        e2el = [m["e2el_ms"] for m in turns]
        rtf = [m["rtf"] for m in turns]
        results[c] = {
            "turns": len(turns),
            "errors": errors,
            "ttfp_p50_ms": _pct(ttfp, 50),
            "ttfp_p90_ms": _pct(ttfp, 90),
            "ttfp_p99_ms": _pct(ttfp, 99),
            "e2el_p50_ms": _pct(e2el, 50),
            "e2el_p90_ms": _pct(e2el, 90),
            "rtf_p50": _pct(rtf, 50),
            "audio_throughput_s_per_s": audio_total / wall_total if wall_total else 0.0,
        }
    return results


def run(
    pcfg,
    backend,
    wav_paths: list[Path],
    concurrency: list[int],
    rounds: int,
    json_out: Path | None,
    max_tokens: int = 24,
    talker_max_tokens: int = 48,
    cfg_scale: float = 1.0,
    ignore_eos: bool = False,
) -> dict:
    """Run the sweep and print a markdown table; returns ``{c: metrics}``."""
    wavs = [load_audio(p) for p in wav_paths]
    meta = serving_meta(max_tokens, talker_max_tokens, ignore_eos=ignore_eos, cfg_scale=cfg_scale)

    async def main():
        orch = Orchestrator(backend, load_tokenizer(pcfg.model), output_rate=output_rate(pcfg.model))
        await orch.start()
        try:
            return await _sweep(orch, wavs, concurrency, rounds, meta)
        finally:
            await orch.stop()

    res = asyncio.run(main())
    print(
        f"\nserve benchmark: {pcfg.model}  {len(wavs)} speech WAVs, {rounds} rounds per level, thinker "
        f"{max_tokens} tokens, talker {'=' if ignore_eos else '≤'}{talker_max_tokens} frames, "
        f"cfg {cfg_scale} (unified)"
    )
    print("| c | turns | TTFP p50 ms | p90 | p99 | E2EL p50 ms | p90 | RTF p50 | audio-s/s | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c, m in res.items():
        print(
            f"| {c} | {m['turns']} | {m['ttfp_p50_ms']:.0f} | {m['ttfp_p90_ms']:.0f} | "
            f"{m['ttfp_p99_ms']:.0f} | "
            f"{m['e2el_p50_ms']:.0f} | {m['e2el_p90_ms']:.0f} | {m['rtf_p50']:.3f} | "
            f"{m['audio_throughput_s_per_s']:.2f} | {m['errors']} |"
        )
    if json_out:
        json_out.write_text(json.dumps(res, indent=2))
    return res
