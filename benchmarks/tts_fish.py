"""Fish Speech S2 Pro serving speed in one process: TTFP, RTF and audio-s/s over a concurrency sweep, with the
family's two levers on or off and their own counters.

For each concurrency ``c``, ``c`` utterances (the sentences below in turn) arrive together at ``t0`` on one
:class:`~omniduplex.pipeline.speech.fish_speech.FishSpeechEngine` (continuous batching, paged KV); each
has its own
:class:`~omniduplex.pipeline.speech.fish_speech.FishStreamDecoder` (a 1-frame first chunk, then
``chunk_frames``-frame chunks; every frame decoded once). Each utterance runs to exactly ``frames`` frames
(``ignore_eos``: random-weight presets have no natural end), sampling with Fish Audio's defaults. The engine
(slow AR + fast AR) and the codec run in turn in this one thread.

Figures (vLLM-Omni's TTS benchmark terms): TTFP = ``t0`` → the utterance's first samples out of its streaming
decoder (ms); RTF = ``t0`` → its last samples, over its audio duration; audio s/s = all audio ÷ the level's
wall time. The levers' counters: ``slow_attn_ms_per_step`` (the slow AR's decode-only attention, all layers,
per
decode step: the q_len = 1 fast path or the dispatcher, :func:`omniduplex.kernels.attention
.time_decode_attention`), ``fast_ar_ms_per_step`` (the fast AR's calls) and ``fast_ar_allocations`` (times its
buffers were allocated over the level; 0 with the lever off, where every step allocates afresh).

Speed only: a random-weight preset's audio is noise. A warm-up utterance runs first (setup off the clock).
Seed figures (vLLM-Omni on an H20, the real S2 Pro): c=64 23.72 audio-s/s, TTFP 900 ms.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from omniduplex.benchmarks.tts_levers import fixed_length, stream_figures, timed_steps
from omniduplex.kernels import attention, cpu_ops
from omniduplex.kernels.paged_attention_ref import paged_attention_torch
from omniduplex.models.fish_speech.config import SAMPLE_RATE
from omniduplex.models.fish_speech.load import load_fish_speech
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.speech.fish_speech import FishSpeechEngine, FishStreamDecoder
from omniduplex.pipeline.stages.engine_build import EngineSettings

SENTENCES = (
    "Hello! Thanks for calling, how can I help you today?",
    "The weather tomorrow in Paris will be sunny with a light breeze.",
    "Green tea is best brewed at about eighty degrees for two minutes.",
    "Your table for four is booked at seven thirty this evening.",
)
SEED_FIGURES = {"c": 64, "audio_s_per_s": 23.72, "ttfp_ms": 900, "where": "vLLM-Omni, H20, real S2 Pro"}


class _Timed:
    """Wraps the fast AR's ``predict``: seconds and calls."""

    def __init__(self, fn) -> None:
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1


def _level(engine: FishSpeechEngine, n: int, frames: int, chunk_frames: int, seed: int) -> dict:
    codec = engine.model.codec
    predictor = engine.lm.code_predictor
    timed = predictor.predict = _Timed(predictor.predict)
    predictor.workspace = None
    decoders = [FishStreamDecoder(codec) for _ in range(n)]
    pending: list[list[torch.Tensor]] = [[] for _ in range(n)]
    first, last, samples = [None] * n, [0.0] * n, [0] * n
    engine_s = codec_s = 0.0
    steps = 0
    prompts = [engine.prompt(SENTENCES[i % len(SENTENCES)]) for i in range(n)]
    try:
        with attention.time_decode_attention() as attn:
            t0 = time.perf_counter()
            for events, step_s in timed_steps(engine, prompts, fixed_length(frames, seed)):
                engine_s += step_s
                steps += 1
                for ev in events:
                    i = int(ev.request_id[1:])
                    tc = time.perf_counter()
                    if ev.codes is not None:
                        pending[i].append(ev.codes)
                    due = 1 if first[i] is None else chunk_frames
                    pieces = []
                    if pending[i] and (len(pending[i]) >= due or ev.finished):
                        pieces.append(decoders[i].feed(torch.stack(pending[i])))
                        pending[i] = []
                    if ev.finished:
                        pieces.append(decoders[i].flush())
                    now = time.perf_counter()
                    codec_s += now - tc
                    got = sum(int(p.shape[0]) for p in pieces)
                    if got:
                        first[i] = first[i] if first[i] is not None else now - t0
                        samples[i] += got
                        last[i] = now - t0
            wall = time.perf_counter() - t0
    finally:
        predictor.predict = timed.fn
    if any(s != frames * codec.hop_length for s in samples):
        raise RuntimeError(
            f"expected {frames * codec.hop_length} samples per utterance, got {sorted(set(samples))}"
        )
    audio = [s / SAMPLE_RATE for s in samples]
    ws = predictor.workspace
    return {
        "c": n,
        "frames": frames,
        **stream_figures(first, last, audio, wall),
        "engine_s": engine_s,
        "codec_s": codec_s,
        "engine_ms_per_step": 1000 * engine_s / max(steps, 1),
        "slow_attn_ms_per_step": 1000
        * attn.seconds
        / max(attn.calls, 1)
        * engine.lm.cfg.slow.num_hidden_layers,
        "slow_attn_s": attn.seconds,
        "fast_ar_ms_per_step": 1000 * timed.seconds / max(timed.calls, 1),
        "fast_ar_allocations": ws.allocations if ws is not None else 0,
    }


def measure(
    model_dir: str | Path,
    concurrency: tuple[int, ...] = (1, 16, 64),
    lever: bool = True,
    frames: int = 40,
    chunk_frames: int = 8,
    threads: int = 2,
    seed: int = 0,
) -> dict:
    """Load ``model_dir`` (lm + codec, fp32), warm up, and measure every level of ``concurrency`` with both
    levers ``lever`` (the slow AR's decode fast path and the fast AR's allocated-once buffers); returns
    ``{"model", "lever", "threads", "rows": [one dict per level, keys as the module docstring]}``."""
    torch.set_num_threads(threads)
    model = load_fish_speech(model_dir, parts=("lm", "codec"))
    engine = FishSpeechEngine(
        model,
        load_tokenizer(model_dir),
        EngineSettings(max_num_seqs=max(concurrency)),
        decode_fast_path=lever,
        static_buffers=lever,
    )
    _level(engine, 1, 3, chunk_frames, seed)
    rows = [_level(engine, c, frames, chunk_frames, seed) for c in concurrency]
    return {"model": str(model_dir), "lever": lever, "threads": threads, "rows": rows}


def attention_probe(
    model_dir: str | Path, c: int = 16, context: int = 160, iters: int = 60, threads: int = 2
) -> dict:
    """The slow AR's decode attention alone at its own shapes: ``c`` sequences of ``context`` cached tokens
    (blocks scattered over the pool), all layers of one decode step, the q_len = 1 fast path vs the
    dispatcher (the path with the lever off: our generic C++ decode kernel) and the plain-torch paged
    attention (the dispatcher without the C++ ops), interleaved call by call; ms per decode step, the
    minimum over ``iters`` rounds (and the median, ``*_p50``)."""
    torch.set_num_threads(threads)
    cfg = load_fish_speech(model_dir, parts=()).config.slow
    g = torch.Generator().manual_seed(0)
    per_seq = -(-context // 16)
    shape = (c * per_seq + 8, 16, cfg.num_key_value_heads, cfg.head_dim)
    k_cache, v_cache = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    tables = torch.randperm(shape[0], generator=g)[: c * per_seq].view(c, per_seq).int()
    lens = torch.full((c,), context, dtype=torch.int32)
    q = torch.randn(c, cfg.num_attention_heads, cfg.head_dim, generator=g)
    qsl = torch.arange(c + 1, dtype=torch.int32)
    scale = cfg.head_dim**-0.5
    paths = {
        "fast_path": lambda: attention.gqa_decode(q, k_cache, v_cache, tables, lens, scale),
        "dispatcher": lambda: attention.paged_attention(
            q, k_cache, v_cache, tables, lens, qsl, scale, max_seq_len=context, max_query_len=1
        ),
        "torch": lambda: paged_attention_torch(q, k_cache, v_cache, tables, lens, qsl, scale, context, 1),
    }
    if not cpu_ops.available() or paths["fast_path"]() is None:
        raise RuntimeError("the fast path does not take this model's shapes (or the C++ ops are not built)")
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(iters):
        for name, fn in paths.items():
            t = time.perf_counter()
            for _ in range(cfg.num_hidden_layers):
                fn()
            times[name].append(time.perf_counter() - t)
    out = {"c": c, "context": context, "layers": cfg.num_hidden_layers}
    for k, v in times.items():  # the minimum: a call preempted by another process is not the kernel's time
        out[f"{k}_ms_per_step"] = 1000 * min(v)
        out[f"{k}_ms_per_step_p50"] = 1000 * statistics.median(v)
    return out


def run(
    model_dir: Path,
    levels: list[int],
    frames: int = 40,
    threads: int = 2,
    json_out: Path | None = None,
) -> list[dict]:
    """Measure every level with the levers off and on, in turn on one engine (the order alternating from level
    to level, so that a change in the host's load falls on both); print the table and the decode-attention
    probe at c = 16; return ``[levers-off result, levers-on result]`` as :func:`measure` returns them."""
    torch.set_num_threads(threads)
    model = load_fish_speech(model_dir, parts=("lm", "codec"))
    engine = FishSpeechEngine(model, load_tokenizer(model_dir), EngineSettings(max_num_seqs=max(levels)))
    results = [
        {"model": str(model_dir), "lever": lever, "threads": threads, "rows": []} for lever in (False, True)
    ]
    for lever in (False, True):
        engine.set_levers(lever, lever)
        _level(engine, 1, 3, 8, 0)
    for k, c in enumerate(levels):
        for lever in (
            False,
            True,
        ):  # the level's first batch of this size (allocator, GEMM kernels) off the clock
            engine.set_levers(lever, lever)
            _level(engine, c, 3, 8, 0)
        for lever in (False, True) if k % 2 == 0 else (True, False):
            engine.set_levers(lever, lever)
            results[lever]["rows"].append(_level(engine, c, frames, 8, 0))
    for res in results:
        res["rows"].sort(key=lambda r: r["c"])
    print(
        f"\nFish Speech S2 bench: {model_dir}, {frames} frames ({frames * 2048 / SAMPLE_RATE:.1f} s) per "
        f"utterance, sampled, {threads} threads, engine and codec in one process. Seed: {SEED_FIGURES}"
    )
    print(
        "| levers | c | TTFP p50 ms | TTFP max ms | RTF p50 | audio s/s | engine ms/step "
        "| slow-AR decode attn ms/step | fast AR ms/step | fast AR allocations |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        for r in res["rows"]:
            print(
                f"| {'on' if res['lever'] else 'off'} | {r['c']} | {r['ttfp_ms_p50']:.0f} "
                f"| {r['ttfp_ms_max']:.0f} | {r['rtf_p50']:.2f} | {r['audio_s_per_s']:.2f} "
                f"| {r['engine_ms_per_step']:.1f} | {r['slow_attn_ms_per_step']:.2f} "
                f"| {r['fast_ar_ms_per_step']:.1f} | {r['fast_ar_allocations']} |",
                flush=True,
            )
    probe = attention_probe(model_dir, threads=threads)
    print(
        f"slow-AR decode attention alone, c={probe['c']}, {probe['context']} cached tokens, "
        f"{probe['layers']} layers: fast path {probe['fast_path_ms_per_step']:.2f} ms/step, "
        f"dispatcher (generic C++ decode kernel) {probe['dispatcher_ms_per_step']:.2f} ms/step, plain torch "
        f"{probe['torch_ms_per_step']:.2f} ms/step (minimum over 60 rounds; medians "
        f"{probe['fast_path_ms_per_step_p50']:.2f} / {probe['dispatcher_ms_per_step_p50']:.2f} / "
        f"{probe['torch_ms_per_step_p50']:.2f})"
    )
    if json_out:
        json_out.write_text(json.dumps({"levels": results, "attention_probe": probe}, indent=2))
    return results


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    run(a.model_dir, [int(c) for c in a.concurrency.split(",")], a.frames, a.threads, a.json)


def bench(
    model_dir: Path, levels: list[int], *, threads: int | None = None, json_out=None, **_
) -> list[dict]:
    """``bench tts`` on a Fish Speech checkpoint (its ``bench`` in the family's declaration): :func:`measure`
    with the levers on and off (:func:`~.tts_levers.lever_bench`)."""
    from omniduplex.benchmarks.tts_levers import lever_bench, measured_rows

    t = threads or 2
    rows = measured_rows(measure, model_dir, levels, t, "slow_attn_ms_per_step")
    seed = {64: "23.72 audio-s/s, TTFP 900 ms"}
    return lever_bench("fish-speech", model_dir, rows, "slow-AR attn ms/step", seed, t, json_out)
