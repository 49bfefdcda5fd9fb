"""``omniduplex bench prefix``: a 10-turn conversation on the cascade LLM, prefix caching on vs off.

The cascade's LLM stage (:class:`~omniduplex.pipeline.stages.llm.LLMWorker`, the packaged SmolLM2-135M-
Instruct weights) answers ten user messages in one conversation; each turn's prompt is the chat template
over the whole history plus the new message, as a session sends it. With prefix caching the history's KV
blocks are reused, so a turn prefills only what follows its last cached full block.

Per turn: prompt tokens, prefill tokens computed (engine counter) and TTFT (``submit`` → first token out
of the stage, ms; median over ``repeats`` conversations, each on a fresh KV cache after a warm-up). The
caching-off run replays the caching-on run's history, so both see the same prompts. Target: TTFT of turn
10 ≤ 1.1 × turn 1 with caching on.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

USER_TURNS = (
    "Hi! Can you help me plan a weekend trip?",
    "I live in Lyon. Where could I go by train in under three hours?",
    "Geneva sounds nice. What is there to see?",
    "Is it expensive to eat out there?",
    "What about Annecy instead?",
    "Can I swim in the lake in September?",
    "Which one would you pick for a couple who likes hiking?",
    "How should I pack for two days of hiking?",
    "Do I need to book the train in advance?",
    "Great, thanks. Can you summarize the plan in two sentences?",
)


def load_llm(dtype: str = "float32"):
    """The cascade's LLM (packaged SmolLM2 weights, imported once into the cache), as a loaded text LM.

    Raises:
        WeightsError: the weight package is missing (one line with the fix).
    """
    from omniduplex.kernels.cpu_linear import prepack_linears
    from omniduplex.models.cascade.manifest import default_manifest, load_manifest, resolve_llm
    from omniduplex.models.registry import load_model
    from omniduplex.models.weights import cache_dir
    from omniduplex.pipeline.config import StageConfig
    from omniduplex.pipeline.workers import _dtype

    cache = cache_dir()
    llm_dir = resolve_llm(load_manifest(default_manifest(cache)), cache)
    model = load_model(llm_dir, parts=("thinker",), dtype=_dtype(StageConfig(dtype=dtype)))
    prepack_linears(model.thinker)  # as the serving stage prepares it (C++ kernels; packed GEMMs in bf16)
    return model


def conversation(model, caching: bool, max_tokens: int, replies: list[str] | None = None) -> list[dict]:
    """Run the 10 turns on a fresh LLM stage; returns per turn ``prompt_tokens``, ``prefill_tokens``
    (computed), ``cached_tokens``, ``ttft_ms`` and ``reply``. ``replies``: use these as the assistant's
    history instead of the stage's own replies (same prompts across runs)."""
    from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.llm import LLMWorker

    sizes = EngineSettings(1024, 4, 1024, enable_prefix_caching=caching)
    worker = LLMWorker(model, sizes)
    history: list[list[str]] = []
    rows = []
    for i, user in enumerate(USER_TURNS):
        opts = TurnOptions(history=[list(h) for h in history], sampling={"max_tokens": max_tokens})
        meta = Transcript(transcript=user, turn=opts)
        before = worker.engine.num_prefill_tokens
        t0 = time.perf_counter()
        worker.submit(StageMessage(f"turn{i}", {}, meta, last=True))
        ttft, prompt, text = None, 0, []
        while worker.has_work():
            for m in worker.step():
                if ttft is None:
                    ttft = (time.perf_counter() - t0) * 1e3
                    prompt = int(m.tensors["prompt_ids"].shape[0])
                text.append(m.meta.text or "")
        computed = worker.engine.num_prefill_tokens - before
        reply = "".join(text).strip() if replies is None else replies[i]
        rows.append(
            dict(
                prompt_tokens=prompt,
                prefill_tokens=computed,
                cached_tokens=prompt - computed,
                ttft_ms=ttft,
                reply=reply,
            )
        )
        history += [["user", user], ["assistant", reply]]
    return rows


def run(
    json_out: Path | None = None,
    max_tokens: int = 32,
    repeats: int = 3,
    threads: int = 2,
    dtype: str = "float32",
) -> dict:
    """Measure and print the per-turn table; returns ``{"on": [...], "off": [...]}`` (medians of TTFT)."""
    torch.set_num_threads(threads)
    model = load_llm(dtype)
    with torch.inference_mode():
        conversation(model, True, 4)  # warm-up (allocator, kernels); its KV cache is discarded
        runs_on = [conversation(model, True, max_tokens) for _ in range(repeats)]
        replies = [r["reply"] for r in runs_on[0]]
        runs_off = [conversation(model, False, max_tokens, replies) for _ in range(repeats)]
    res = {}
    for name, runs in (("on", runs_on), ("off", runs_off)):
        rows = [dict(r) for r in runs[0]]
        for t, row in enumerate(rows):
            row["ttft_ms"] = statistics.median(run[t]["ttft_ms"] for run in runs)
            row["ttft_ms_all"] = [run[t]["ttft_ms"] for run in runs]
        res[name] = rows
    on, off = res["on"], res["off"]
    print(
        f"\nprefix caching: 10-turn conversation, cascade LLM (SmolLM2-135M, {dtype}), "
        f"{max_tokens} reply tokens, {threads} threads, TTFT median of {repeats}"
    )
    print(
        "| turn | prompt tokens | prefill computed (on) | TTFT on (ms) "
        "| prefill computed (off) | TTFT off (ms) |"
    )
    print("|---|---|---|---|---|---|")
    for t, (a, b) in enumerate(zip(on, off), 1):
        print(
            f"| {t} | {a['prompt_tokens']} | {a['prefill_tokens']} | {a['ttft_ms']:.1f} | "
            f"{b['prefill_tokens']} | {b['ttft_ms']:.1f} |"
        )
    ratio_on = on[-1]["ttft_ms"] / on[0]["ttft_ms"]
    ratio_off = off[-1]["ttft_ms"] / off[0]["ttft_ms"]
    print(f"TTFT turn 10 / turn 1: caching on {ratio_on:.2f}x (target <= 1.1x), off {ratio_off:.2f}x")
    res["ttft_ratio_on"], res["ttft_ratio_off"] = ratio_on, ratio_off
    if json_out:
        json_out.write_text(json.dumps(res, indent=2))
    return res
