"""VoxCPM2 serving speed on our engine, in process, over a concurrency sweep, with its lever on and off.

For each concurrency ``c``, ``c`` utterances (the sentences below in turn, the default voice or a cloned one)
arrive together at ``t0`` on one :class:`~omniduplex.pipeline.speech.voxcpm2.VoxCPM2Engine`; each has its own
:class:`~omniduplex.models.voxcpm2.vae_stream.VAEStream` fed every patch as it comes (one patch = 4 latent
frames = 160 ms of 48 kHz audio). Each utterance runs to exactly ``patches`` patches (``ignore_stop``: random
weights have no natural end). Engine steps are charged to "lm" (both LMs, the flow-matching solve, the
LocEnc), the AudioVAE to "vae" (the step's patches of all utterances in one decoder call, states stacked:
:func:`~omniduplex.models.voxcpm2.vae_stream.feed_together`; with the lever off, one call per utterance).

Figures (vLLM-Omni's TTS benchmark terms): TTFP (``t0`` → first PCM out of the utterance's decoder, ms),
RTF (``t0`` → last PCM over the audio duration), audio s/s (all audio ÷ wall time), and the lever's counter:
flow-matching solver calls per engine step that made patches (1 with the tail batched, up to ``c`` without).
The seed (vLLM-Omni on an H20) reports 33.07 audio s/s for VoxCPM2 at c=64: a 2B model on a GPU, not
comparable with a random small preset on two CPU cores; it is printed for orientation.

``python -m omniduplex.benchmarks.tts_voxcpm2 DIR [c ...] [--device cuda] [--dtype bfloat16]`` prints the
table (lever on, then off); :func:`measure` returns the rows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from omniduplex.benchmarks.tts_levers import stream_figures
from omniduplex.models.voxcpm2.model import VoxCPM2, load_voxcpm2
from omniduplex.models.voxcpm2.prompt import TextTokenizer, VoiceBank, build_prompt
from omniduplex.models.voxcpm2.vae_stream import VAEStream, feed_together
from omniduplex.pipeline.speech.voxcpm2 import VoxCPM2Engine
from omniduplex.pipeline.stages.engine_build import EngineSettings

SENTENCES = (
    "Hello! Thanks for calling, how can I help you today?",
    "The weather tomorrow in Paris will be sunny with a light breeze.",
    "Green tea is best brewed at about eighty degrees for two minutes.",
    "Your table for four is booked at seven thirty this evening.",
)
SEED_AUDIO_S_PER_S = {64: 33.07}
"""The seed's VoxCPM2 figure (vLLM-Omni, H20, c=64)."""


def _voices(model: VoxCPM2, kind: str) -> tuple[TextTokenizer, VoiceBank, str]:
    tok = TextTokenizer(Tokenizer.from_file(str(model.path / "tokenizer.json")))
    bank = VoiceBank(model.lm, model.vae)
    if kind == "clone":  # a 2 s synthetic clip registered as a reference voice (its prefix is shared)
        t = np.arange(32000) / 16000
        clip = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
        bank.register("clone", reference=(clip, 16000))
    return tok, bank, kind


def level(
    model: VoxCPM2, tok: TextTokenizer, bank: VoiceBank, voice: str, c: int, patches: int, lever: bool
) -> dict:
    """One concurrency level on a fresh engine; returns its figures."""
    sizes = EngineSettings(num_blocks=max(256, 16 * c), max_num_seqs=max(c, 1))
    engine = VoxCPM2Engine(model, sizes, batch_solver=lever)
    v = bank.get(voice)
    prompts = [
        build_prompt(model.lm, tok, SENTENCES[i % len(SENTENCES)], v, model.config.context) for i in range(c)
    ]
    streams = [VAEStream(model.vae, p.context) for p in prompts]
    first, last, samples = [None] * c, [0.0] * c, [0] * c
    lm_s = vae_s = 0.0
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add(f"u{i}", p, {"ignore_stop": True, "max_len": patches, "seed": i})
    while engine.has_unfinished():
        ts = time.perf_counter()
        events = engine.step()
        tv = time.perf_counter()
        lm_s += tv - ts
        ids = [int(ev.request_id[1:]) for ev in events]
        if ids:
            lat = torch.stack([ev.latents for ev in events])[:, None]
            if lever:  # every due utterance's patch through the decoder in one call
                n = feed_together([streams[i] for i in ids], lat).shape[1]
            else:
                n = [streams[i].feed(x) for i, x in zip(ids, lat)][0].shape[0]
            now = time.perf_counter()
            for i in ids:
                if first[i] is None:
                    first[i] = now - t0
                samples[i] += n
                last[i] = now - t0
        vae_s += time.perf_counter() - tv
    wall = time.perf_counter() - t0
    rate = model.sample_rate
    audio = [s / rate for s in samples]
    return {
        "c": c,
        "lever": lever,
        "patches": patches,
        **stream_figures(first, last, audio, wall),
        "lm_s": lm_s,
        "vae_s": vae_s,
        "decode_steps": engine.decode_steps,
        "solver_calls": engine.solver_calls,
        "solver_calls_per_step": engine.solver_calls / max(1, engine.decode_steps),
        "seed_audio_s_per_s": SEED_AUDIO_S_PER_S.get(c),
    }


def measure(
    model_dir: str | Path,
    concurrency: tuple[int, ...] = (1, 16, 64),
    lever: bool = True,
    patches: int = 20,
    threads: int = 2,
    voice: str = "default",
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Warm up, then every level of ``concurrency`` with the lever as given; returns ``{"rows": [...]}``.
    ``dtype`` is the LMs' (the AudioVAE stays fp32, as the reference keeps it)."""
    torch.set_num_threads(threads)
    model = load_voxcpm2(model_dir, dtype=dtype, device=device)
    tok, bank, voice = _voices(model, voice)
    level(model, tok, bank, voice, 1, 3, lever)  # warm-up: kernel setup off the clock
    rows = [level(model, tok, bank, voice, c, patches, lever) for c in concurrency]
    info = {
        "model": str(model_dir),
        "threads": threads,
        "voice": voice,
        "device": device,
        "dtype": str(dtype),
    }
    return {**info, "rows": rows}


def print_table(rows: list[dict]) -> None:
    print(
        "| c | lever | TTFP p50 ms | TTFP max ms | RTF p50 | audio s/s | seed audio s/s | solver calls/step "
        "| lm s | vae s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        seed = "" if r["seed_audio_s_per_s"] is None else f"{r['seed_audio_s_per_s']:.2f} (H20)"
        print(
            f"| {r['c']} | {'on' if r['lever'] else 'off'} | {r['ttfp_ms_p50']:.0f} | {r['ttfp_ms_max']:.0f} "
            f"| {r['rtf_p50']:.2f} | {r['audio_s_per_s']:.2f} | {seed} | {r['solver_calls_per_step']:.2f} "
            f"| {r['lm_s']:.1f} | {r['vae_s']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="VoxCPM2 engine benchmark, lever on and off")
    ap.add_argument("model", type=Path)
    ap.add_argument("levels", type=int, nargs="*", default=[1, 16])
    ap.add_argument("--patches", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--voice", choices=("default", "clone"), default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    a = ap.parse_args()
    out = []
    for on in (True, False):
        kw = dict(patches=a.patches, threads=a.threads, voice=a.voice, device=a.device)
        out += measure(a.model, tuple(a.levels), lever=on, dtype=getattr(torch, a.dtype), **kw)["rows"]
    print_table(out)
    print(json.dumps(out))


def bench(
    model_dir: Path, levels: list[int], *, threads: int | None = None, json_out=None, **_
) -> list[dict]:
    """``bench tts`` on a VoxCPM2 checkpoint (its ``bench`` in the family's declaration): :func:`measure`
    with the lever on and off (:func:`~.tts_levers.lever_bench`)."""
    from omniduplex.benchmarks.tts_levers import lever_bench, measured_rows

    t = threads or 2
    rows = measured_rows(measure, model_dir, levels, t, "solver_calls_per_step")
    seed = {c: f"{v} audio-s/s" for c, v in SEED_AUDIO_S_PER_S.items()}
    return lever_bench("voxcpm2", model_dir, rows, "solver calls/step", seed, t, json_out)
