"""``omniduplex bench code2wav``: the Code2Wav stage's decode of ``c`` turns' steady chunks, one batched
forward (:func:`~omniduplex.models.qwen3_omni.code2wav_batch.push_together`) against one forward per turn
(vLLM-Omni's Code2Wav, vllm-omni#272), on the same streams at the same positions.

Each turn is a :class:`~omniduplex.models.qwen3_omni.code2wav_stream.Code2WavStream` pushed ``warm`` frames
first (the turns start at different frames, so rows sit at different positions), then ``steps`` steps of
one ``chunk``-frame piece per turn. Figures per ``c``: ms per step (p50 over the steps), audio-s/s (the
audio the steps decoded ÷ their time; 12.5 frames = 1 s) for both ways, and the speed-up. Speed only:
random-weight audio is noise.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from omniduplex.models.qwen3_omni.code2wav_batch import push_together
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream

FRAME_RATE_HZ = 12.5
"""Qwen3-Omni codec frames per second of audio (Code2Wav: 1920 samples at 24 kHz per frame)."""


def _turns(model, c: int, warm: int, seed: int) -> list[Code2WavStream]:
    g = torch.Generator().manual_seed(seed)
    streams = []
    for i in range(c):
        s = Code2WavStream(model)
        n = warm + i % 4  # turns at different frames
        s.push(torch.randint(0, model.cfg.codebook_size, (1, model.cfg.num_quantizers, n), generator=g))
        streams.append(s)
    return streams


@torch.no_grad()
def measure(
    model, levels: list[int], chunk: int = 8, steps: int = 5, warm: int = 4, max_batch: int = 64
) -> list[dict]:
    """Rows ``{c, batched_ms, single_ms, batched_audio_s_per_s, single_audio_s_per_s, speedup}`` (ms per
    step, p50); the batched way runs forwards of at most ``max_batch`` turns (the stage's ``max_num_seqs``).
    Raises ValueError: a level, ``chunk``, ``steps`` or ``max_batch`` < 1."""
    if min(levels) < 1 or chunk < 1 or steps < 1 or max_batch < 1:
        raise ValueError("levels, chunk, steps and max_batch must be >= 1")
    rows = []
    for c in levels:
        batched, single = _turns(model, c, warm, c), _turns(model, c, warm, c)
        g = torch.Generator().manual_seed(7)
        t_b, t_s = [], []
        for _ in range(steps):
            codes = torch.randint(
                0, model.cfg.codebook_size, (c, model.cfg.num_quantizers, chunk), generator=g
            )
            t0 = time.perf_counter()
            for i in range(0, c, max_batch):
                push_together(batched[i : i + max_batch], codes[i : i + max_batch])
            t_b.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for b, s in enumerate(single):
                s.push(codes[b : b + 1])
            t_s.append(time.perf_counter() - t0)
        audio = c * chunk / FRAME_RATE_HZ  # seconds of audio per step
        mb, ms = float(np.median(t_b)), float(np.median(t_s))
        rows.append(
            {
                "c": c,
                "batched_ms": 1000 * mb,
                "single_ms": 1000 * ms,
                "batched_audio_s_per_s": audio / mb,
                "single_audio_s_per_s": audio / ms,
                "speedup": ms / mb,
            }
        )
        r = rows[-1]
        print(
            f"| {c} | {r['batched_ms']:.1f} | {r['single_ms']:.1f} | {r['batched_audio_s_per_s']:.1f} "
            f"| {r['single_audio_s_per_s']:.1f} | {r['speedup']:.2f}x |",
            flush=True,
        )
    return rows


HEADER = (
    "| c | batched ms/step | one-per-turn ms/step | batched audio-s/s | one-per-turn audio-s/s | speed-up |\n"
    "|---|---|---|---|---|---|"
)


def run(
    model_dir: Path,
    levels: list[int],
    chunk: int,
    steps: int,
    threads: int,
    json_out: Path | None,
    max_batch: int = 64,
):
    """Load ``model_dir``'s Code2Wav (fp32, CPU), print the table, write ``json_out``."""
    from omniduplex.models.registry import load_model

    torch.set_num_threads(threads)
    model = load_model(model_dir, parts=("code2wav",)).code2wav
    print(
        f"\nCode2Wav of {model_dir}: {chunk}-frame chunks, {steps} steps, {threads} thread(s), "
        f"at most {max_batch} turns per batched forward"
    )
    print(HEADER)
    rows = measure(model, levels, chunk, steps, max_batch=max_batch)
    if json_out:
        out = {"model": str(model_dir), "chunk": chunk, "max_batch": max_batch, "rows": rows}
        json_out.write_text(json.dumps(out, indent=2))
    return rows
