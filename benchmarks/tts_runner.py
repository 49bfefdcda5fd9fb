"""``omniduplex bench tts`` for a registered family that declares no benchmark of its own (a plugin's): its
:class:`~omniduplex.pipeline.speech.family_runner.FamilyRunner` in process, ``c`` utterances arriving
together per concurrency level, each streamed through its own decoder.

Figures (vLLM-Omni's TTS benchmark terms): TTFP (arrival → the utterance's first PCM, ms, p50), RTF (arrival
→ its last PCM over its audio duration, p50) and audio s/s (all audio ÷ wall time).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from omniduplex.pipeline.speech.registry import load_runner

SENTENCES = (
    "Hello! Thanks for calling, how can I help you today?",
    "The weather tomorrow in Paris will be sunny with a light breeze.",
)


def level(runner, c: int, frames: int) -> dict:
    """``c`` utterances at once, each at most ``frames`` frames, run to the end; one row of figures."""
    prompts = [runner.prompt(SENTENCES[i % len(SENTENCES)]) for i in range(c)]
    t0 = time.perf_counter()
    decoders = {}
    for i, p in enumerate(prompts):
        decoders[f"r{i}"] = runner.decoder(p)
        runner.add(f"r{i}", p, frames, runner.greedy)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    samples = dict.fromkeys(decoders, 0)
    while runner.engine.has_unfinished():
        for ev in runner.engine.step():
            n = runner.decode(decoders[ev.request_id], ev).size
            if ev.finished:
                n += runner.flush(decoders[ev.request_id]).size
            now = time.perf_counter() - t0
            if n:
                samples[ev.request_id] += n
                first.setdefault(ev.request_id, now)
                last[ev.request_id] = now
    wall = time.perf_counter() - t0
    audio = {r: s / runner.sample_rate for r, s in samples.items()}
    spoken = [r for r in audio if audio[r] > 0]
    return {
        "c": c,
        "ttfp_ms_p50": 1e3 * statistics.median(first[r] for r in spoken) if spoken else float("nan"),
        "rtf": statistics.median(last[r] / audio[r] for r in spoken) if spoken else float("nan"),
        "audio_s_per_s": sum(audio.values()) / wall,
    }


def bench(
    model_dir: Path,
    levels: list[int],
    *,
    threads: int | None = None,
    json_out: Path | None = None,
    frames: int = 50,
    **_,
) -> list[dict]:
    """Load ``model_dir``'s runner, warm up, measure every level, print the table; return the rows.

    Raises ValueError: no registered family's checkpoint; CheckpointError: it does not load."""
    torch.set_num_threads(threads or 2)
    runner = load_runner(model_dir, max_num_seqs=max(levels))
    level(runner, 1, 2)  # warm-up off the clock
    rows = [level(runner, c, frames) for c in levels]
    print(f"\n{runner.family} bench: {model_dir}, {threads or 2} threads, in-process runner (no lever)")
    print("| c | TTFP p50 ms | RTF | audio s/s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['c']} | {r['ttfp_ms_p50']:.1f} | {r['rtf']:.3f} | {r['audio_s_per_s']:.2f} |")
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2))
    return rows
