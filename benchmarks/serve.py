"""``omniduplex bench serve``: a concurrency sweep of spoken turns through the whole pipeline.

For each ``c`` in the sweep, ``c`` turns (built from the speech WAVs given, cycled) are submitted at
once, ``rounds`` times; per turn we record TTFP (submit → first PCM chunk), E2EL (submit → done),
RTF (E2EL ÷ audio seconds) and audio seconds. Audio throughput = audio seconds generated ÷ wall
seconds of the round, summed over the concurrent turns.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from omniduplex.app.host.pipeline import serving_meta
from omniduplex.benchmarks.report import print_table, write_json
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.messages import TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.topology import CASCADE, topology_for


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def _sweep(
    orch: Orchestrator, wavs: list[np.ndarray], concurrency: list[int], rounds: int, meta: TurnOptions
):
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
        rtf = [m["rtf"] for m in turns if m["audio_s"]]
        split = {
            f"{k}_p50": _pct([m[k] for m in turns if k in m], 50)
            for k in ("asr_ms", "llm_first_clause_ms", "tts_first_chunk_ms")
        }
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
            **split,
        }
    return results


def run(
    pcfg,
    orch: Orchestrator,
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
    shape = topology_for(pcfg.model).name
    meta = serving_meta(
        max_tokens, talker_max_tokens, ignore_eos=ignore_eos, cfg_scale=cfg_scale, shape=shape
    )

    async def main():
        await orch.start()
        try:
            return await _sweep(orch, wavs, concurrency, rounds, meta)
        finally:
            await orch.stop()

    res = asyncio.run(main())
    budget = "=" if ignore_eos else "≤"
    if shape == CASCADE.name:
        what = f"cascade (asr → llm → tts), llm {budget}{max_tokens} tokens"
    else:
        what = f"thinker {max_tokens} tokens, talker {budget}{talker_max_tokens} frames"
        what += f", cfg {cfg_scale} (unified)"
    print(f"\nserve benchmark: {pcfg.model}  {len(wavs)} speech WAVs, {rounds} rounds per level, {what}")
    print("| c | turns | TTFP p50 ms | p90 | p99 | E2EL p50 ms | p90 | RTF p50 | audio-s/s | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c, m in res.items():
        print(
            f"| {c} | {m['turns']} | {m['ttfp_p50_ms']:.0f} | {m['ttfp_p90_ms']:.0f} | "
            f"{m['ttfp_p99_ms']:.0f} | "
            f"{m['e2el_p50_ms']:.0f} | {m['e2el_p90_ms']:.0f} | {m['rtf_p50']:.3f} | "
            f"{m['audio_throughput_s_per_s']:.2f} | {m['errors']} |"
        )
    if shape == CASCADE.name:
        print("\nTTFP split, p50 ms (ASR compute | LLM prefill + first clause | TTS first chunk):")
        print_table(
            ["c", "ASR", "LLM first clause", "TTS first chunk"],
            (
                [c, f"{m['asr_ms_p50']:.0f}", f"{m['llm_first_clause_ms_p50']:.0f}",
                 f"{m['tts_first_chunk_ms_p50']:.0f}"]
                for c, m in res.items()
            ),
        )
    write_json(res, json_out)
    return res
