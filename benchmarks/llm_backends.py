"""``omniduplex bench llm``: the cascade's LLM stage on each backend (our engine, vLLM), through the stage
worker contract itself (chat turns in, one message per token out), as the pipeline drives it.

Workload per concurrency level ``c``: ``c`` chat turns (distinct questions, the cascade's system prompt)
submitted at once, greedy, exactly ``new_tokens`` reply tokens each (``ignore_eos``), ``rounds`` times.
Reported: generated tokens/s over the round (all turns), and TTFT = submit → the turn's first token
message, p50 and max over the turns (ms). Each backend is warmed up with one turn first. vLLM runs with
the stage settings given (default: fp32, eager, 1 GiB KV); our engine with the same dtype.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from omniduplex.benchmarks.report import print_table, write_json
from omniduplex.pipeline.config import StageConfig
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Why is the sky blue?",
    "How do I make a cup of green tea?",
    "What should I pack for a weekend hike?",
    "Explain what a rainbow is.",
    "Suggest a name for a black cat.",
    "How many days are in a leap year?",
]


def _turn(rid: str, i: int, new_tokens: int, system_prompt: str) -> StageMessage:
    sampling = {"temperature": 0.0, "max_tokens": new_tokens, "ignore_eos": True}
    opts = TurnOptions(system_prompt=system_prompt, sampling=sampling)
    return StageMessage(rid, {}, Transcript(transcript=QUESTIONS[i % len(QUESTIONS)], turn=opts), last=True)


def measure(worker, c: int, new_tokens: int, rounds: int, system_prompt: str) -> dict[str, float]:
    """``c`` turns at once on ``worker``, ``rounds`` times: ``tok_s`` (generated ids / wall s of the rounds),
    ``ttft_p50_ms`` / ``ttft_max_ms`` (submit → first token message)."""
    tokens, wall, ttft = 0, 0.0, []
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in range(c):
            worker.submit(_turn(f"r{r}c{c}i{i}", r * c + i, new_tokens, system_prompt))
        first: dict[str, float] = {}
        while worker.has_work():
            for m in worker.step():
                tokens += len(m.tensors["token"])
                first.setdefault(m.request_id, time.perf_counter())
        wall += time.perf_counter() - t0
        ttft += [(t - t0) * 1000 for t in first.values()]
    return {
        "tok_s": tokens / wall,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_max_ms": float(max(ttft)),
    }


def run(
    model_dir: Path,
    concurrency: list[int],
    json_out: Path | None,
    new_tokens: int = 64,
    rounds: int = 2,
    dtype: str = "float32",
    backends: tuple[str, ...] = ("omniduplex", "vllm"),
    threads: int = 1,
) -> dict:
    """Measure each backend at each ``c`` and print a markdown table; returns
    ``{backend: {c: {"tok_s", "ttft_p50_ms", "ttft_max_ms"}}}``."""
    from omniduplex.app.host.pipeline import CASCADE_SYSTEM_PROMPT
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.llm import LLMWorker
    from omniduplex.pipeline.workers import _dtype

    torch.set_num_threads(threads)
    td = _dtype(dtype)
    res: dict[str, dict[int, dict[str, float]]] = {}
    for backend in backends:
        if backend == "vllm":
            from omniduplex.pipeline.stages.vllm_llm import VLLMLLMWorker

            cfg = StageConfig(backend="vllm", dtype=dtype, max_num_seqs=max(concurrency), kv_cache_gib=1)
            worker = VLLMLLMWorker(model_dir, cfg, td)
        else:
            model = load_model(model_dir, parts=("thinker",), dtype=td)
            worker = LLMWorker(model, EngineSettings(1024, max(concurrency), 1024))
        try:
            system = CASCADE_SYSTEM_PROMPT
            measure(worker, 1, 8, 1, system)  # warm-up
            res[backend] = {c: measure(worker, c, new_tokens, rounds, system) for c in concurrency}
        finally:
            close = getattr(worker, "close", None)
            if callable(close):
                close()
    print(
        f"\nLLM stage benchmark: {model_dir}  chat turns, {new_tokens} new tokens each, greedy, {dtype}, "
        f"{rounds} rounds per level, our engine on {threads} torch thread(s)"
    )
    print_table(
        ["backend", "c", "tok/s", "TTFT p50 ms", "TTFT max ms"],
        (
            [backend, c, f"{m['tok_s']:.1f}", f"{m['ttft_p50_ms']:.0f}", f"{m['ttft_max_ms']:.0f}"]
            for backend, levels in res.items()
            for c, m in levels.items()
        ),
    )
    write_json(res, json_out)
    return res
