"""``omniduplex bench tools --spoken``: the tool requests spoken, through the whole cascade (ASR → LLM with
tools → TTS), one at a time (c = 1).

Each request of :file:`tools.yaml` is spoken by espeak-ng in one of :data:`VOICES` (cycled: accents, rates,
pitches; :func:`~omniduplex.benchmarks.qa.speak`) and fed to the stages of a cascade manifest while it is
"spoken" (real-time pace, the LLM prefilling the words heard: :func:`~omniduplex.benchmarks.qa.feed_live`),
with the tools offered (``tool_choice: auto``, greedy, as :mod:`.tools`' text run). Scored like the text
run (:func:`~.tools.score`): right tool, right arguments, spurious calls, the post-result reply in words
(:func:`~.tools.in_words`, on what the TTS was given), plus the ASR's word error rate. Timed from the end
of the caller's speech (the turn's submit, as the session commits it):

* ``answer_ms``: first reply audio of a request that needs no tool (TTFP);
* ``call_ms``: the call complete (``CallDone``): when a session starts the tool;
* ``filler_ms``: the first audio of a request that makes a call: the runner's filler, said as the reply
  opens the call (the session offers it as ``call_filler``: ``tool_turns.ToolCalls.offer``);
* ``result_ms``: from the tool's output (the continuation submitted with the call and its output in the
  history, as the session does) to the first audio of the result sentence.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from omniduplex.benchmarks import qa
from omniduplex.benchmarks.tools import ToolRequest, TurnResult, aggregate, refused_repeat, score

VOICES = (
    ("en-us", 160, 50), ("en", 175, 40), ("en-us+f3", 150, 60), ("en-gb", 140, 45), ("en-us+m3", 185, 55)
)
"""espeak-ng ``(voice, words per minute, pitch)`` cycled over the requests."""


@dataclass
class SpokenTurn:
    """One spoken request: what the ASR heard, what the model did (:class:`~.tools.TurnResult`) and the
    timings of the module docstring (ms; ``None`` where they do not apply)."""

    transcript: str = ""
    result: TurnResult = field(default_factory=TurnResult)
    answer_ms: float | None = None
    filler_ms: float | None = None
    call_ms: float | None = None
    result_ms: float | None = None
    error: str | None = None


async def _turn(orch, rid: str, t0: float, turn: SpokenTurn) -> float | None:
    """Drain turn ``rid``'s events into ``turn``; ms from ``t0`` to its first audio (``None``: none)."""
    from omniduplex.pipeline.events import CallDone, CallFailed

    first_audio, said = None, ""
    async for ev in orch.events(rid):
        now = 1000 * (time.perf_counter() - t0)
        if ev.kind == "transcript":
            turn.transcript = ev.text or ""
        elif ev.kind == "text":
            said += ev.text
        elif ev.kind == "audio" and first_audio is None and len(ev.pcm):
            first_audio = now
        elif isinstance(ev, CallDone):
            turn.result.calls.append({"call_id": ev.call_id, "name": ev.name, "arguments": ev.arguments})
            turn.call_ms = turn.call_ms if turn.call_ms is not None else now
        elif isinstance(ev, CallFailed):
            turn.result.failed.append(ev)
        elif ev.kind == "error":
            turn.error = str(ev.error)
    turn.result.said = said
    return first_audio


async def ask(orch, request: ToolRequest, wav: np.ndarray, meta) -> SpokenTurn:
    """One spoken request (``meta``: the turn's ``TurnOptions``) and, when it made the expected call, the
    continuation with the tool's output."""
    from omniduplex.pipeline.messages import Prefill

    turn = SpokenTurn()
    context = Prefill(system_prompt=meta.system_prompt or "", history=[])
    rid = await qa.feed_live(orch, wav, context)
    t0 = time.perf_counter()
    orch.submit(np.concatenate([wav, np.zeros(int(qa.ENDPOINT_S * 16000), np.float32)]), meta, request_id=rid)
    first = await _turn(orch, rid, t0, turn)
    calls = turn.result.calls
    if calls:
        turn.filler_ms = first  # the filler, said as the call opened
    else:
        turn.answer_ms = first
    if request.call is None or not calls or calls[0]["name"] != request.call["name"]:
        return turn
    history: list = [["user", turn.transcript]]
    if turn.result.said.strip():
        history.append(["assistant", turn.result.said.strip()])
    for k, c in enumerate(calls):
        output = request.output if k == 0 else {"error": "not available"}
        history += [{"type": "function_call", **c},
                    {"type": "function_call_output", "call_id": c["call_id"], "output": json.dumps(output)}]
    t1 = time.perf_counter()
    cont = meta.model_copy(update={"history": history, "user_text": "", "call_filler": None})
    rid = orch.submit(np.zeros(0, np.float32), cont)
    follow = SpokenTurn()
    turn.result_ms = await _turn(orch, rid, t1, follow)
    if refused_repeat(follow.result):  # the session goes on with no tool (tool_turns.py)
        rid = orch.submit(np.zeros(0, np.float32), cont.model_copy(update={"tool_choice": "none"}))
        turn.result_ms = await _turn(orch, rid, t1, follow)
    turn.result.follow_up, turn.result.follow_up_calls = follow.result.said, len(follow.result.calls)
    return turn


def _p(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_manifest(manifest: str, requests: list[ToolRequest], tools: list[dict], date: str,
                 processes: bool = False) -> dict:
    """Every request spoken through the cascade of ``manifest``; the aggregate scores and timings."""
    from omniduplex.app.host.pipeline import RespondOptions, new_orchestrator
    from omniduplex.app.host.tools.runner import FILLER_TEXT
    from omniduplex.models.weights import cache_dir
    from omniduplex.pipeline.audio_io import load_audio
    from omniduplex.pipeline.config import load_graph
    from omniduplex.pipeline.text.spoken import spoken_tools_prompt

    questions = [qa.Question(r.text, (), *VOICES[i % len(VOICES)]) for i, r in enumerate(requests)]
    wavs = [load_audio(qa.speak(q, cache_dir() / "bench-tools"), 16000) for q in questions]
    system = spoken_tools_prompt([t.get("description", "") for t in tools], date)
    meta = RespondOptions(greedy=True, max_tokens=64).meta("cascade")
    names = [t["name"] for t in tools]  # as a session offers its runner's tools, with the filler
    meta = meta.model_copy(update={"system_prompt": system, "tools": tools, "tool_choice": "auto",
                                   "call_filler": FILLER_TEXT, "call_filler_tools": names})
    orch = new_orchestrator(load_graph(None, model=manifest), processes=processes)

    async def main():
        await orch.start()
        try:
            await ask(orch, requests[0], wavs[0], meta)  # warm-up (not counted)
            turns = []
            for r, w in zip(requests, wavs):
                turns.append(await ask(orch, r, w, meta))
                t = turns[-1]
                calls = [(c["name"], c["arguments"]) for c in t.result.calls]
                print(f"  heard {t.transcript[:56]!r} | said {t.result.said[:60]!r} | calls {calls} | "
                      f"then {t.result.follow_up!r}", flush=True)
            return turns
        finally:
            await orch.stop()

    turns = asyncio.run(main())
    schemas = {t["name"]: t["parameters"] for t in tools}
    agg = aggregate([score(r, t.result, schemas) for r, t in zip(requests, turns)])
    calls = [t.call_ms for t in turns if t.call_ms is not None]
    out = {
        **agg,
        "wer": statistics.mean(qa.wer(r.text, t.transcript) for r, t in zip(requests, turns)),
        "answer_ms": [t.answer_ms for t in turns if t.answer_ms is not None],
        "call_ms": calls,
        "filler_ms": [t.filler_ms for t in turns if t.filler_ms is not None],
        "result_ms": [t.result_ms for t in turns if t.result_ms is not None],
        "turns": [
            {"request": r.text, "transcript": t.transcript, **t.result.__dict__, "answer_ms": t.answer_ms,
             "filler_ms": t.filler_ms, "call_ms": t.call_ms, "result_ms": t.result_ms, "error": t.error}
            for r, t in zip(requests, turns)
        ],
    }
    return out


def print_rows(rows: list[tuple[str, dict]]) -> None:
    """One row per model: scores, WER and the timings' p50 / p90 (ms)."""
    print("spoken  model                 n  right tool  right args  spurious  in words  WER   "
          "answer p50/p90  call p50/p90  filler p50  result p50/p90")
    for name, r in rows:
        print(f"        {name:<20} {r['n']:>2}  {r['right_tool']:>9.0%}  {r['right_args']:>10.0%}  "
              f"{r['spurious']:>8.0%}  {r['uses_result']:>8.0%}  {r['wer']:>4.0%}  "
              f"{_p(r['answer_ms'], .5):>6.0f}/{_p(r['answer_ms'], .9):<6.0f}  "
              f"{_p(r['call_ms'], .5):>5.0f}/{_p(r['call_ms'], .9):<6.0f}  {_p(r['filler_ms'], .5):>10.0f}  "
              f"{_p(r['result_ms'], .5):>6.0f}/{_p(r['result_ms'], .9):<6.0f}")


def run(models: list[tuple[str, str]], limit: int | None, json_out=None, processes: bool = False) -> None:
    """The spoken tier over ``models`` (``(name, manifest)``): a row each (printed as each finishes, then
    all together); ``json_out``: every turn as JSON."""
    from omniduplex.benchmarks.tools import load

    tools, requests, date = load()
    if limit is not None:
        needs = [r for r in requests if r.call][:limit]
        requests = needs + [r for r in requests if not r.call][: max(1, limit // 4)]
    rows = []
    for name, manifest in models:
        rows.append((name, run_manifest(manifest, requests, tools, date, processes)))
        print_rows(rows[-1:])
    print()
    print_rows(rows)
    if json_out is not None:
        json_out.write_text(json.dumps(dict(rows), indent=1))
