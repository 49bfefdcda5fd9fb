"""``omniduplex bench tts`` through the stage processes: the Qwen3-TTS graph (``tts_talker → tts_codec``,
:data:`~omniduplex.pipeline.topology.QWEN3_TTS`) served as it is in production, each stage in its own process
joined by the relay, driven through the orchestrator.

For each concurrency ``c``, ``c`` utterances (:data:`.tts.SENTENCES` in turn, CustomVoice speakers in turn)
are submitted together; each runs to exactly ``frames`` codec frames (``ignore_eos``), sampling with the
reference's defaults (seeded). Figures (as :mod:`.tts`):

- TTFP: submit → the first waveform piece at the orchestrator (ms), with its split: the talker stage's
  admission → first frame, and the codec stage's 1-frame decode call (the rest: relay hops and queueing);
- RTF: an utterance's submit → last piece over its audio duration; audio s/s: all audio ÷ the level's wall
  time;
- per stage: each process's busy seconds over the level (talker engine steps, codec decode calls, from the
  stages' gauges) and ms per frame; the codec's utterance-rows per decode call (its batching).

Speed only: the audio of a random-weight preset is noise. One warm-up utterance runs first.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

from omniduplex.benchmarks.tts import SENTENCES
from omniduplex.models.checkpoint import read_config
from omniduplex.models.qwen3_tts.config import TTSConfig
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE
from omniduplex.pipeline.config import load_graph
from omniduplex.pipeline.messages import TurnOptions, UtteranceRequest
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.process_backend import ProcessBackend

STATS_SETTLE_S = 3.0
"""Longest wait for the stages' gauges to report a level's last frames (they report about once a second)."""


async def _utterance(orch: Orchestrator, text: str, voice: TurnOptions) -> dict:
    """Speak ``text`` with ``voice`` (its ``voice`` and ``sampling``); the utterance's metrics."""
    rid = orch.speak(UtteranceRequest(text=text, turn=voice))
    async for ev in orch.events(rid):
        if ev.kind == "error":
            raise RuntimeError(f"utterance {rid} failed: {ev.error}")
        if ev.kind == "done":
            return ev.metrics
    raise RuntimeError(f"utterance {rid} ended without done")


async def _totals(backend: ProcessBackend, frames: int | None) -> dict:
    """The stages' cumulative gauges, once both have reported ``frames`` frames (``None``: the same number,
    not 0), or after :data:`STATS_SETTLE_S`."""
    deadline = time.monotonic() + STATS_SETTLE_S
    while True:
        st = backend.stats()["stages"]
        t, c = st.get("tts_talker", {}), st.get("tts_codec", {})
        made, decoded = t.get("frames", 0), c.get("frames", 0)
        if made == decoded and (made == frames if frames is not None else made > 0):
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    keys = ("step_s", "frames", "decode_s", "calls", "rows")
    return {k: float(t.get(k, 0) if k == "step_s" else c.get(k, 0)) for k in keys}


async def _level(orch, backend, speakers, c: int, frames: int, done_frames: int) -> dict:
    before = await _totals(backend, done_frames)
    t0 = time.perf_counter()
    metrics = await asyncio.gather(
        *(
            _utterance(
                orch,
                SENTENCES[i % len(SENTENCES)],
                TurnOptions(
                    voice=speakers[i % len(speakers)],
                    sampling={"max_tokens": frames + 1, "ignore_eos": True, "seed": i},
                ),
            )
            for i in range(c)
        )
    )
    wall = time.perf_counter() - t0
    after = await _totals(backend, done_frames + c * frames)
    audio = [m["audio_s"] for m in metrics]
    if any(abs(a - frames * 0.08) > 1e-6 for a in audio):
        raise RuntimeError(f"expected {frames * 0.08:.2f} s per utterance, got {sorted(set(audio))}")
    n = c * frames
    d = {k: after[k] - before[k] for k in after}
    return {
        "c": c,
        "frames": frames,
        "ttfp_ms_p50": statistics.median(m["ttfp_ms"] for m in metrics),
        "ttfp_ms_max": max(m["ttfp_ms"] for m in metrics),
        "first_frame_ms_p50": statistics.median(m["talker_first_frame_ms"] for m in metrics),
        "first_decode_ms_p50": statistics.median(m["codec_first_chunk_ms"] for m in metrics),
        "rtf_p50": statistics.median(m["rtf"] for m in metrics),
        "audio_s_per_s": sum(audio) / wall,
        "wall_s": wall,
        "talker_s": d["step_s"],
        "codec_s": d["decode_s"],
        "talker_ms_per_frame": 1000 * d["step_s"] / n,
        "codec_ms_per_frame": 1000 * d["decode_s"] / n,
        "codec_rows_per_call": d["rows"] / d["calls"] if d["calls"] else 0.0,
    }


def run_processes(
    model_dir: Path,
    levels: list[int],
    frames: int = 50,
    threads: int = 1,
    json_out: Path | None = None,
    codec_threads: int | None = None,
) -> list[dict]:
    """Start the two stage processes (``threads`` torch threads each), warm up, measure every level in
    ``levels``, print the table; returns the rows.

    Raises:
        StageStartError: a stage did not start (named with its cause).
        RuntimeError: an utterance failed or made the wrong amount of audio.
    """
    pcfg = load_graph(None, model=str(model_dir), side_asr=None)
    pcfg.side_asr = None
    for stage, n in (("tts_talker", threads), ("tts_codec", codec_threads or threads)):
        pcfg.stages[stage] = pcfg.stage(stage).model_copy(
            update={"torch_threads": n, "max_num_seqs": max(64, max(levels))}
        )
    cfg = TTSConfig.from_dict(read_config(model_dir))
    speakers = sorted(cfg.speakers) if cfg.variant == "custom_voice" else [None]
    rows: list[dict] = []

    async def main() -> None:
        backend = ProcessBackend(pcfg)
        orch = Orchestrator(backend, None, output_rate=SAMPLE_RATE)
        await orch.start()
        try:
            await _utterance(orch, SENTENCES[0], TurnOptions(voice=speakers[0], sampling={"max_tokens": 4}))
            done = int((await _totals(backend, None))["frames"])
            print(
                f"\nQwen3-TTS bench: {model_dir}, {frames} frames ({frames * 0.08:.1f} s) per utterance, "
                f"sampled, stage processes (tts_talker → tts_codec), {threads} torch thread(s) each"
            )
            print(
                "| c | TTFP p50 ms (talker first frame + 1-frame decode) | TTFP max ms | RTF p50 | audio s/s "
                "| talker ms/frame | codec ms/frame | codec rows/call | talker s | codec s |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|")
            for c in levels:
                r = await _level(orch, backend, speakers, c, frames, done)
                done += c * frames
                rows.append(r)
                print(
                    f"| {c} | {r['ttfp_ms_p50']:.0f} "
                    f"({r['first_frame_ms_p50']:.0f} + {r['first_decode_ms_p50']:.0f}) "
                    f"| {r['ttfp_ms_max']:.0f} | {r['rtf_p50']:.2f} | {r['audio_s_per_s']:.2f} "
                    f"| {r['talker_ms_per_frame']:.1f} | {r['codec_ms_per_frame']:.1f} "
                    f"| {r['codec_rows_per_call']:.1f} | {r['talker_s']:.1f} | {r['codec_s']:.1f} |",
                    flush=True,
                )
        finally:
            await orch.stop()

    asyncio.run(main())
    if json_out:
        out = {"model": str(model_dir), "mode": "processes", "threads": threads, "rows": rows}
        json_out.write_text(json.dumps(out, indent=2))
    return rows
