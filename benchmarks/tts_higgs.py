"""Higgs Audio v3 serving speed in one process: TTFP, RTF, audio-s/s over a concurrency sweep, and the lever's
counter (host time of the decode-state work per step), with the lever on or off.

For each concurrency ``c``, ``c`` utterances (:data:`SENTENCES` in turn, the checkpoint's voices in turn)
arrive together at ``t0`` on one :class:`~omniduplex.pipeline.speech.higgs.HiggsEngine`; each runs to exactly
``frames`` frames (``ignore_eos``: random presets have no natural end; ``max_tokens = frames + N − 1``
under the v3 rules), sampling at the v3 serving defaults. Each utterance has its own
:class:`~omniduplex.models.higgs.codec_stream.StreamingDecoder`: frames are fed one by one until its first
samples come out (the decoder's look-ahead), then in pieces of ``chunk`` frames, the rest at the end.

Figures (vLLM-Omni's TTS benchmark terms): TTFP = ``t0`` → the utterance's first samples out of its decoder
(ms); RTF = ``t0`` → its last samples, over its audio duration; audio-s/s = all audio ÷ the level's wall
time. Lever counters, per engine step: ``state_ms_per_step`` (the adapter's decode-state work: gathering and
scattering the slot table, the delay-pattern rules, the frame gather, the outputs; per request in the loop
with the lever off), ``sample_ms_per_step`` (drawing ``N`` codes per request: arithmetic on ``B·N·V``
logits) and ``step_ms`` (a whole engine step). Speed only: a random preset's audio is noise.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from omniduplex.benchmarks.tts_levers import fixed_length, timed_steps
from omniduplex.models.higgs.codec_stream import StreamingDecoder
from omniduplex.models.higgs.model import Higgs, load_higgs
from omniduplex.pipeline.speech.higgs import HiggsEngine
from omniduplex.pipeline.stages.engine_build import EngineSettings

SENTENCES = (
    "Hello! Thanks for calling, how can I help you today?",
    "The weather tomorrow in Paris will be sunny with a light breeze.",
    "Green tea is best brewed at about eighty degrees for two minutes.",
    "Your table for four is booked at seven thirty this evening.",
)
SAMPLING = dict(temperature=1.0, top_k=0, top_p=1.0)


def _level(model: Higgs, c: int, frames: int, lever: bool, chunk: int, seed: int) -> dict:
    n = model.config.num_codebooks
    sizes = EngineSettings(num_blocks=max(256, c * 24), max_num_seqs=max(c, 1))
    engine = HiggsEngine(model, lever=lever, engine=sizes)
    voices = sorted(model.voices) or [None]
    prompts = [engine.prompt(SENTENCES[i % len(SENTENCES)], voices[i % len(voices)]) for i in range(c)]
    streams = [StreamingDecoder(model.codec) for _ in range(c)]
    pending: list[list[torch.Tensor]] = [[] for _ in range(c)]
    first, last, samples = [None] * c, [0.0] * c, [0] * c
    steps, step_s, codec_s = 0, 0.0, 0.0
    t0 = time.perf_counter()
    sampling = fixed_length(frames + n - 2, seed, **SAMPLING)
    for events, s in timed_steps(engine, prompts, sampling):
        step_s += s
        steps += 1
        tc = time.perf_counter()
        for ev in events:
            i = int(ev.request_id[1:])
            if ev.codes is not None:
                pending[i].append(ev.codes)
            due = ev.finished or (first[i] is None and pending[i]) or len(pending[i]) >= chunk
            out = streams[i].feed(torch.stack(pending[i])) if due and pending[i] else None
            if due:
                pending[i] = []
            if ev.finished:
                tail = streams[i].flush()
                out = tail if out is None else torch.cat([out, tail])
            if out is not None and out.numel():
                now = time.perf_counter()
                samples[i] += out.numel()
                last[i] = now - t0
                if first[i] is None:
                    first[i] = now - t0
        codec_s += time.perf_counter() - tc
    wall = time.perf_counter() - t0
    sr = model.codec.cfg.sample_rate
    audio = [s / sr for s in samples]
    a = engine.adapter
    return {
        "concurrency": c,
        "lever": lever,
        "frames": frames,
        "ttfp_ms_mean": round(1e3 * statistics.mean(first), 1),
        "ttfp_ms_p50": round(1e3 * statistics.median(first), 1),
        "ttfp_ms_max": round(1e3 * max(first), 1),
        "rtf_mean": round(statistics.mean(t / d for t, d in zip(last, audio)), 3),
        "audio_s_per_s": round(sum(audio) / wall, 2),
        "wall_s": round(wall, 2),
        "engine_steps": steps,
        "step_ms": round(1e3 * step_s / steps, 2),
        "state_ms_per_step": round(1e3 * a.state_seconds / max(1, a.decode_steps), 3),
        "sample_ms_per_step": round(1e3 * a.sample_seconds / max(1, a.decode_steps), 3),
        "head_ms_per_step": round(1e3 * a.head_seconds / max(1, a.decode_steps), 3),
        "codec_s": round(codec_s, 2),
    }


@torch.no_grad()
def measure(
    model_dir: str | Path,
    concurrency=(1, 16, 64),
    lever: bool = True,
    frames: int = 50,
    chunk: int = 25,
    seed: int = 0,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Run the sweep on ``model_dir`` (talker on ``device`` in ``dtype``, the codec on the CPU); returns
    ``{"model": ..., "levels": [per-level dict]}`` (figures in the module docstring)."""
    model = load_higgs(model_dir, dtype=dtype, device=device)
    if device != "cpu":
        model.codec.to("cpu")
    _level(model, 1, 12, lever, chunk, seed)  # warm-up: kernel setup off the clock
    levels = [_level(model, c, frames, lever, chunk, seed) for c in concurrency]
    return {"model": str(model_dir), "device": device, "levels": levels}


def bench(
    model_dir: Path, levels: list[int], *, threads: int | None = None, json_out=None, **_
) -> list[dict]:
    """``bench tts`` on a Higgs checkpoint (its ``bench`` in the family's declaration): :func:`measure` with
    the lever on and off (:func:`~.tts_levers.lever_bench`)."""
    from omniduplex.benchmarks.tts_levers import common_rows, lever_bench

    torch.set_num_threads(threads or 2)

    def rows(lever: bool) -> list[dict]:
        got = measure(model_dir, tuple(levels), lever=lever)["levels"]
        return common_rows(got, "state_ms_per_step", c_key="concurrency", rtf_key="rtf_mean")

    return lever_bench(
        "higgs", model_dir, rows, "state ms/step", {16: "35.26 audio-s/s"}, threads or 2, json_out
    )
