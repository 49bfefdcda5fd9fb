"""``omniduplex bench spec``: speculative decoding on the packaged LLMs — acceptance rate and speedup per
(target, proposer) pair, with and without speculation in the same run.

Pairs: prompt lookup (``ngram``) on SmolLM2-135M, Qwen2.5-Coder-0.5B and 1.5B; the 0.5B as the 1.5B's draft
model (``draft``). Models whose weights are not installed are skipped (a line says so). Every model runs as
the cascade's LLM stage serves a GGUF (``llm_quantized: true``: our quantized-block kernels), through the
stage worker (:class:`~omniduplex.pipeline.stages.llm.LLMWorker`), one turn at a time (c = 1, a voice call).

Workloads (greedy, the spoken system prompt, at most ``max_tokens`` ids, stop at EOS):

- ``qa``: the spoken questions of ``bench llm``;
- ``tool``: a turn after a tool result (the reply says the result in words; lookup drafts copy from it).

Per pair and workload: ``tok_s`` (ids after each turn's first / the wall time after it, summed over the
turns) without and with speculation, ``speedup`` (their ratio), ``acceptance`` (draft ids kept / proposed)
and ``ids_per_step`` (ids a speculating step emitted, on average), and ``same`` (greedy replies identical:
speculation is lossless).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from omniduplex.benchmarks.llm_backends import QUESTIONS
from omniduplex.pipeline.engine.speculative import SpeculativeConfig
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT

TOOL_HISTORY = [
    ["user", "Where is my order 4217?"],
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "get_order_status",
        "arguments": '{"order_number": "4217"}',
    },
    {
        "type": "function_call_output",
        "call_id": "c1",
        "output": '{"status": "shipped", "carrier": "UPS", "arrives": "Friday, March 14", '
        '"tracking": "1Z999AA1"}',
    },
]


def _turns(workload: str, n: int, max_tokens: int) -> list[Transcript]:
    sampling = {"temperature": 0.0, "max_tokens": max_tokens}
    if workload == "qa":
        opts = TurnOptions(system_prompt=SPOKEN_SYSTEM_PROMPT, sampling=sampling)
        return [Transcript(turn=opts, transcript=QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]
    opts = TurnOptions(
        user_text="", history=TOOL_HISTORY, system_prompt=SPOKEN_SYSTEM_PROMPT, sampling=sampling
    )
    return [Transcript(turn=opts, transcript="")] * min(n, 2)


def _run_turn(worker, meta: Transcript, rid: str) -> tuple[list[int], float]:
    """One turn alone: its ids and the wall time after its first id."""
    worker.submit(StageMessage(rid, {}, meta))
    ids: list[int] = []
    first = None
    while worker.has_work():
        for m in worker.step():
            ids += m.tensors["token"].tolist()
            first = first or time.perf_counter()
    end = time.perf_counter()
    return ids, end - (first or end)


def _compare(plain, fast, metas: list[dict], tag: str) -> tuple[bool, list[int], list[float]]:
    """Each turn on ``plain`` then on ``fast`` (interleaved: a busy host's load hits both alike); returns
    whether every reply is the same, and per worker the ids after each first one and the wall time after."""
    same, tokens, wall = True, [0, 0], [0.0, 0.0]
    for i, meta in enumerate(metas):
        outs = [_run_turn(w, meta, f"{tag}{j}-{i}") for j, w in enumerate((plain, fast))]
        same &= outs[0][0] == outs[1][0]
        for j, (ids, s) in enumerate(outs):
            tokens[j] += max(0, len(ids) - 1)
            wall[j] += s
    return same, tokens, wall


def _load(gguf: Path):
    from omniduplex.kernels.cpu_linear import prepack_linears
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.cascade.gguf_quantized import load_quantized
    from omniduplex.models.weights import cache_dir

    model = load_quantized(cached_import(gguf, cache_dir() / "gguf"), gguf)
    prepack_linears(model.thinker)
    return model


def _models() -> dict[str, Path | str]:
    """Name → GGUF path, or the reason it is missing."""
    from omniduplex.models import weights as w

    out: dict[str, Path | str] = {}
    for name, get in (
        ("SmolLM2-135M", lambda: w.locate(w.SMOLLM2_135M)),
        ("Qwen2.5-Coder-0.5B", lambda: w.assemble(w.QWEN25_CODER_05B)),
        ("Qwen2.5-Coder-1.5B", lambda: w.assemble(w.QWEN25_CODER_15B)),
    ):
        try:
            out[name] = get()
        except w.WeightsError as e:
            out[name] = str(e).splitlines()[0]
    return out


PAIRS = [
    ("SmolLM2-135M", "ngram"),
    ("Qwen2.5-Coder-0.5B", "ngram"),
    ("Qwen2.5-Coder-1.5B", "ngram"),
    ("Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B"),
]


def run(
    json_out: Path | None, k: int, turns: int, max_tokens: int, threads: int, only: str | None
) -> list[dict]:
    """Measure every pair (``only``: the pairs whose target or proposer names contain it); print a table."""
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.llm import LLMWorker

    torch.set_num_threads(threads)
    paths = _models()
    loaded: dict[str, object] = {}
    rows = []
    print(f"k={k}, {turns} turns of at most {max_tokens} ids per workload, c=1, {threads} thread(s)")
    print(
        f"{'target':<20} {'proposer':<20} {'work':<5} {'tok/s':>7} {'spec':>7} {'speedup':>7} "
        f"{'accept':>7} {'ids/step':>8} same"
    )
    for target, proposer in PAIRS:
        if only and only not in target and only not in proposer:
            continue
        missing = [n for n in (target, proposer) if n != "ngram" and not isinstance(paths[n], Path)]
        if missing:
            print(f"{target:<20} {proposer:<20} skipped: {paths[missing[0]]}")
            continue
        for name in (target, proposer):
            if name != "ngram" and name not in loaded:
                loaded[name] = _load(paths[name])
        model = loaded[target]
        if proposer == "ngram":
            spec, draft = SpeculativeConfig("ngram", k), None
        else:
            spec, draft = SpeculativeConfig("draft", k, str(paths[proposer])), loaded[proposer]
        plain = LLMWorker(model, EngineSettings(512, 1, 512))
        fast = LLMWorker(model, EngineSettings(512, 1, 512), speculative=spec, draft=draft)
        for workload in ("qa", "tool"):
            metas = _turns(workload, turns, max_tokens)
            _compare(plain, fast, metas[:1], f"warm-{workload}")  # kernels built, system prompt cached
            s = fast.engine.spec
            before = (s.num_drafted, s.num_accepted, s.num_verified, s.num_emitted)
            same, (n0, n1), (w0, w1) = _compare(plain, fast, metas, workload)
            drafted, accepted, verified, emitted = (
                a - b for a, b in zip((s.num_drafted, s.num_accepted, s.num_verified, s.num_emitted), before)
            )
            row = {
                "target": target,
                "proposer": proposer,
                "workload": workload,
                "k": k,
                "tok_s": n0 / w0 if w0 else float("nan"),
                "spec_tok_s": n1 / w1 if w1 else float("nan"),
                "acceptance": accepted / drafted if drafted else 0.0,
                "ids_per_step": emitted / verified if verified else 1.0,
                "same": same,
                "tokens": n1,
            }
            row["speedup"] = row["spec_tok_s"] / row["tok_s"]
            rows.append(row)
            print(
                f"{target:<20} {proposer:<20} {workload:<5} {row['tok_s']:7.1f} {row['spec_tok_s']:7.1f} "
                f"{row['speedup']:6.2f}x {row['acceptance']:7.2f} {row['ids_per_step']:8.2f} {row['same']}",
                flush=True,
            )
    if json_out is not None:
        json_out.write_text(json.dumps(rows, indent=2) + "\n")
    return rows
