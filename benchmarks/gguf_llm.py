"""``omniduplex bench llm --gguf FILE``: one GGUF on our engine (``quantized``: its GGML blocks on our
kernels; ``int8``: dequantised, then int8 per channel on aten's weight-only kernel,
:mod:`omniduplex.kernels.int8_linear`; ``bf16`` / ``dequantized`` (fp32): dequantised) and on llama.cpp
(``llama-cpp-python``, when installed), at concurrency ``c``.

Workload per level ``c``: ``c`` chat turns (distinct questions, the cascade's system prompt) at once,
greedy, exactly ``new_tokens`` reply tokens each (EOS ignored), ``rounds`` times, after one warm-up turn.
Reported per engine and ``c``:

- ``decode_tok_s``: tokens generated after the last turn's first token / the wall time from then to the
  end of the round (the aggregate decode rate of ``c`` sequences);
- ``tok_s``: all generated tokens / the rounds' wall time (prefill included);
- ``ttft_p50_ms`` / ``ttft_max_ms``: submit → the turn's first token.

Our engine runs through the cascade's LLM stage worker (:class:`~omniduplex.pipeline.stages.llm.LLMWorker`),
prepared as the stage prepares it. ``llama-cpp-python``'s ``Llama`` API serves one sequence at a time, so
its ``c`` turns run one after another (its figure at ``c`` is what that API gives ``c`` callers).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from omniduplex.benchmarks.llm_backends import QUESTIONS, _turn
from omniduplex.benchmarks.report import print_table, write_json

ENGINES = ("quantized", "int8", "bf16", "dequantized", "llama.cpp")
"""The engines ``run`` measures (module doc)."""


def _measure_worker(worker, c: int, new_tokens: int, rounds: int, system: str) -> dict[str, float]:
    tokens = decode_tokens = 0
    wall = decode_wall = 0.0
    ttft: list[float] = []
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in range(c):
            worker.submit(_turn(f"g{r}c{c}i{i}", r * c + i, new_tokens, system))
        first: dict[str, float] = {}
        stamps: list[tuple[float, int]] = []
        while worker.has_work():
            for m in worker.step():
                now = time.perf_counter()
                n = len(m.tensors["token"])
                tokens += n
                stamps.append((now, n))
                first.setdefault(m.request_id, now)
        end = time.perf_counter()
        wall += end - t0
        start = max(first.values())
        decode_tokens += sum(n for t, n in stamps if t > start)
        decode_wall += end - start
        ttft += [(t - t0) * 1000 for t in first.values()]
    return _summary(tokens, wall, decode_tokens, decode_wall, ttft)


def _summary(tokens, wall, decode_tokens, decode_wall, ttft) -> dict[str, float]:
    return {
        "decode_tok_s": decode_tokens / decode_wall if decode_wall > 0 else float("nan"),
        "tok_s": tokens / wall,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_max_ms": float(max(ttft)),
    }


def _our_worker(gguf: Path, engine: str, max_seqs: int):
    from omniduplex.kernels.cpu_linear import prepack_linears
    from omniduplex.kernels.int8_linear import quantize_linears
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.cascade.gguf_quantized import load_quantized
    from omniduplex.models.registry import load_model
    from omniduplex.models.weights import cache_dir
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.llm import LLMWorker

    dtype = torch.bfloat16 if engine in ("bf16", "int8") else torch.float32
    folder = cached_import(gguf, cache_dir() / "gguf")
    if engine == "quantized":
        model = load_quantized(folder, gguf, dtype)
    else:
        model = load_model(folder, parts=("thinker",), dtype=dtype)
    if engine == "int8":
        quantize_linears(model.thinker)
    prepack_linears(model.thinker)
    return LLMWorker(model, EngineSettings(1024, max_seqs, 1024))


def _llama_cpp(gguf: Path, levels: list[int], new_tokens: int, rounds: int, threads: int, system: str):
    """llama.cpp on the same GGUF, or ``None`` when ``llama_cpp`` is not importable."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    eos = llm.token_eos()

    def turn(i: int) -> tuple[float, float, int]:  # (ttft s, decode s after the first token, tokens)
        msgs = [
            {"role": "system", "content": system},
            {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
        ]
        t0 = time.perf_counter()
        first, n = None, 0
        for _ in llm.create_chat_completion(
            msgs, max_tokens=new_tokens, temperature=0.0, stream=True, logit_bias={eos: -1e9}
        ):
            n += 1
            first = first or time.perf_counter()
        end = time.perf_counter()
        return (first or end) - t0, end - (first or end), n

    turn(0)  # warm-up
    out = {}
    for c in levels:
        tokens = decode_tokens = 0
        wall = decode_wall = 0.0
        ttft = []
        for r in range(rounds):
            t0 = time.perf_counter()
            for i in range(c):
                t_first, t_dec, n = turn(r * c + i)
                ttft.append((time.perf_counter() - t0 - t_dec) * 1000)  # waits for the turns before it
                tokens += n
                decode_tokens += max(n - 1, 0)
                decode_wall += t_dec
            wall += time.perf_counter() - t0
        out[c] = _summary(tokens, wall, decode_tokens, decode_wall, ttft)
    return out


def run(
    gguf: Path,
    concurrency: list[int],
    json_out: Path | None = None,
    new_tokens: int = 64,
    rounds: int = 2,
    threads: int = 2,
    engines: tuple[str, ...] = ("quantized", "int8", "bf16", "dequantized", "llama.cpp"),
) -> dict:
    """Measure each engine at each ``c``, print a markdown table; returns ``{engine: {c: figures}}``
    (``llama.cpp`` absent when ``llama-cpp-python`` is not installed)."""
    from omniduplex.app.host.pipeline import CASCADE_SYSTEM_PROMPT
    from omniduplex.kernels import quant

    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise ValueError(f"unknown engine(s) {sorted(unknown)}: choose from {ENGINES}")
    torch.set_num_threads(threads)
    system = CASCADE_SYSTEM_PROMPT
    res: dict[str, dict[int, dict[str, float]]] = {}
    for engine in engines:
        if engine == "llama.cpp":
            got = _llama_cpp(gguf, concurrency, new_tokens, rounds, threads, system)
            if got is None:
                print("llama.cpp: llama-cpp-python is not installed; skipped")
            else:
                res[engine] = got
            continue
        worker = _our_worker(gguf, engine, max(concurrency))
        _measure_worker(worker, 1, 8, 1, system)  # warm-up
        res[f"ours-{engine}"] = {
            c: _measure_worker(worker, c, new_tokens, rounds, system) for c in concurrency
        }
        del worker
    print(
        f"\nGGUF LLM benchmark: {gguf.name}  {new_tokens} new tokens per turn, greedy, {rounds} rounds per "
        f"level, {threads} thread(s); quantized kernels: {quant.isa()}"
    )
    print_table(
        ["engine", "c", "decode tok/s", "tok/s", "TTFT p50 ms", "TTFT max ms"],
        (
            [engine, c, f"{m['decode_tok_s']:.1f}", f"{m['tok_s']:.1f}", f"{m['ttft_p50_ms']:.0f}",
             f"{m['ttft_max_ms']:.0f}"]
            for engine, levels in res.items()
            for c, m in levels.items()
        ),
    )
    write_json(res, json_out)
    return res
