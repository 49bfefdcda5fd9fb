"""``omniduplex bench tts``: Qwen3-TTS serving speed over a concurrency sweep, per stage.

For each concurrency ``c``, ``c`` utterances (the sentences below in turn, CustomVoice speakers in turn on
a CustomVoice checkpoint) arrive together at ``t0`` on one
:class:`~omniduplex.pipeline.speech.qwen3_tts.Qwen3TTSEngine` (continuous batching, paged KV); each has its
own :class:`~omniduplex.models.qwen3_tts.codec_stream.StreamingDecoder` (1-frame first chunk, then
25-frame chunks, per-layer decoder state: each frame decoded once). Each utterance runs to exactly
``frames`` codec frames (``ignore_eos``: random-weight presets have no natural end), sampling with the
reference's defaults. Both stages run in this one process, in turn: every engine step is charged to
"talker" (talker + code predictor), every codec call to "codec".

Figures (vLLM-Omni's TTS benchmark terms):

- TTFP: ``t0`` → the utterance's first waveform piece out (ms), with its split: talker until the first frame
  (prefill + code predictor) and the 1-frame codec decode.
- RTF: an utterance's ``t0`` → last piece, over its audio duration (< 1 is faster than real time).
- audio s/s: all audio produced ÷ wall time of the level.
- per stage: wall seconds of each stage over the level and ms per codec frame.

Speed only: the audio of a random-weight preset is noise. One warm-up utterance runs first (kernel setup off
the clock).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from omniduplex.benchmarks.tts_levers import fixed_length, stream_figures, timed_steps
from omniduplex.models.qwen3_tts import text as tts_text
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE, Qwen3TTS, load_qwen3_tts
from omniduplex.models.qwen3_tts.prompt import TalkerPrompt, build_prompt
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine
from omniduplex.pipeline.stages.engine_build import EngineSettings

SENTENCES = (
    "Hello! Thanks for calling, how can I help you today?",
    "The weather tomorrow in Paris will be sunny with a light breeze.",
    "Green tea is best brewed at about eighty degrees for two minutes.",
    "Your table for four is booked at seven thirty this evening.",
)


def prompts(model: Qwen3TTS, tok, n: int) -> list[TalkerPrompt]:
    """``n`` talker prompts: :data:`SENTENCES` in turn, CustomVoice speakers in turn (none otherwise)."""
    speakers = sorted(model.config.speakers) if model.config.variant == "custom_voice" else [None]
    return [
        build_prompt(
            model.talker,
            tts_text.text_ids(tok, SENTENCES[i % len(SENTENCES)]),
            speaker=speakers[i % len(speakers)],
        )
        for i in range(n)
    ]


def measure(engine: Qwen3TTSEngine, batch: list[TalkerPrompt], frames: int, seed: int = 0) -> dict:
    """Run ``batch`` to ``frames`` frames each, all admitted at once; returns the level's figures."""
    codec = engine.model.codec
    hop = codec.total_upsample
    n = len(batch)
    streams = [StreamingDecoder(codec) for _ in batch]
    first = [None] * n  # seconds from t0 to the first waveform piece
    first_frame = [None] * n  # seconds from t0 to the first frame out of the engine
    first_decode = [None] * n  # seconds of the first (1-frame) codec call
    last = [0.0] * n
    samples = [0] * n
    talker_s = codec_s = 0.0
    decoded_frames = 0
    empty = torch.zeros((1, codec.cfg.num_quantizers, 0), dtype=torch.long)
    t0 = time.perf_counter()
    for events, step_s in timed_steps(engine, batch, fixed_length(frames, seed)):
        talker_s += step_s
        for ev in events:
            i = int(ev.request_id[1:])
            tc = time.perf_counter()
            if first_frame[i] is None and ev.codes is not None:
                first_frame[i] = tc - t0
            pieces = streams[i].push(ev.codes.view(1, -1, 1)) if ev.codes is not None else []
            if ev.finished:
                pieces += streams[i].push(empty, final=True)
            now = time.perf_counter()
            codec_s += now - tc
            if pieces:
                if first[i] is None:
                    first[i], first_decode[i] = now - t0, now - tc
                samples[i] += sum(int(x.shape[-1]) for x in pieces)
                last[i] = now - t0
        decoded_frames += sum(ev.codes is not None for ev in events)
    wall = time.perf_counter() - t0
    audio = [s / SAMPLE_RATE for s in samples]
    if any(s != frames * hop for s in samples):
        raise RuntimeError(f"expected {frames * hop} samples per utterance, got {sorted(set(samples))}")
    return {
        "c": n,
        "frames": frames,
        **stream_figures(first, last, audio, wall),
        "first_frame_ms_p50": 1000 * statistics.median(first_frame),
        "first_decode_ms_p50": 1000 * statistics.median(first_decode),
        "talker_s": talker_s,
        "codec_s": codec_s,
        "talker_ms_per_frame": 1000 * talker_s / decoded_frames,
        "codec_ms_per_frame": 1000 * codec_s / decoded_frames,
    }


def run(
    model_dir: Path,
    levels: list[int],
    frames: int = 50,
    threads: int = 2,
    json_out: Path | None = None,
) -> list[dict]:
    """Warm up, measure every level in ``levels``, print the table; returns the rows."""
    torch.set_num_threads(threads)
    model = load_qwen3_tts(model_dir, parts=("talker", "codec"))
    tok = load_tokenizer(model_dir)
    engine = Qwen3TTSEngine(model, EngineSettings(max_num_seqs=max(levels)))
    measure(engine, prompts(model, tok, 1), 3)
    rows = []
    print(
        f"\nQwen3-TTS bench: {model_dir} ({model.config.variant}), {frames} frames "
        f"({frames * 0.08:.1f} s) per utterance, sampled, {threads} threads, talker and codec in one process"
    )
    print(
        "| c | TTFP p50 ms (first frame + 1-frame decode) | TTFP max ms | RTF p50 | audio s/s "
        "| talker ms/frame | codec ms/frame | talker s | codec s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for c in levels:
        r = measure(engine, prompts(model, tok, c), frames)
        rows.append(r)
        print(
            f"| {c} | {r['ttfp_ms_p50']:.0f} "
            f"({r['first_frame_ms_p50']:.0f} + {r['first_decode_ms_p50']:.0f}) "
            f"| {r['ttfp_ms_max']:.0f} | {r['rtf_p50']:.2f} | {r['audio_s_per_s']:.2f} "
            f"| {r['talker_ms_per_frame']:.1f} | {r['codec_ms_per_frame']:.1f} "
            f"| {r['talker_s']:.1f} | {r['codec_s']:.1f} |",
            flush=True,
        )
    if json_out:
        json_out.write_text(json.dumps({"model": str(model_dir), "threads": threads, "rows": rows}, indent=2))
    return rows
