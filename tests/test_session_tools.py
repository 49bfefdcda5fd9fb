"""The core's tool-call path with a server-side ToolRunner (app/core/tools.py): the session runs the calls
the reply makes and continues the same reply with their outputs; a runner's error becomes an ``{"error"}``
output; the per-turn call limit leaves no tool to call; barge-in while a tool runs keeps the call and its
output but starts no continuation. The pipeline is scripted at the session ↔ pipeline seam (the real
cascade: tests/e2e/test_realtime_tools_e2e.py)."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from omniduplex.app.core.events import FunctionCallOutput, ReplyEnded, ToolCall
from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tools import (
    CallArgumentsDelta,
    CallDone,
    CallFailed,
    CallStarted,
    FunctionCall,
    ToolRunner,
)
from omniduplex.pipeline.stages.tool_calls import REPEAT_ERROR, call_key

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


class CallingResponder:
    """Calls ``get_weather`` while a tool may be called (tools offered, choice not ``none``); else speaks."""

    output_rate = 24000

    def __init__(self, cities=("Oslo", "Bergen", "Tromsø", "Bodø")) -> None:
        self.starts: list[tuple[str, list, dict]] = []
        self.cancelled: list[str] = []
        self.queues: dict[str, asyncio.Queue] = {}
        self.cities = cities  # the city of each call in turn (the same twice: a repeated call)

    def start(self, turn_id, waveform, history, options=None):
        options = options or {}
        self.starts.append((turn_id, history, options))
        q = self.queues[turn_id] = asyncio.Queue()
        if options.get("tools") and options.get("tool_choice") != "none":
            cid = f"call_{len(self.starts)}"
            args = json.dumps({"city": self.cities[(len(self.starts) - 1) % len(self.cities)]})
            for ev in (CallStarted(cid, "get_weather"), CallArgumentsDelta(cid, args),
                       CallDone(cid, "get_weather", args)):
                q.put_nowait(ev)
        else:
            q.put_nowait(ReplyTextDelta("It is cold."))
            q.put_nowait(ReplyAudioChunk(np.full(2400, 0.1, np.float32), "It is cold."))
        q.put_nowait(ReplyDone())

    async def events(self, turn_id):
        q = self.queues[turn_id]
        while True:
            ev = await q.get()
            yield ev
            if isinstance(ev, ReplyDone | ReplyFailed):
                return

    def cancel(self, turn_id):
        self.cancelled.append(turn_id)


class Runner:
    tools = [WEATHER]

    def __init__(self, max_calls: int = 4, fail: bool = False, gate: asyncio.Event | None = None) -> None:
        self.max_calls, self.fail, self.gate = max_calls, fail, gate
        self.calls: list[FunctionCall] = []

    async def run(self, call: FunctionCall) -> str:
        self.calls.append(call)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise TimeoutError("weather service timed out")
        return json.dumps({"city": call.parsed_arguments()["city"], "temperature_c": -3})


async def converse(runner: Runner, tools: dict | None = None, during=None, responder=None):
    resp, events = responder or CallingResponder(), []
    s = Session("s", resp, events.append, SessionConfig(output_rate=24000), tool_runner=runner)
    s.add_user_text("Weather in Oslo?")
    s.respond(tools=tools)
    async with asyncio.timeout(10):
        while not any(isinstance(e, ReplyEnded) for e in events):
            if during is not None and await during(s, events):
                during = None
            s.pull_audio(480)
            await asyncio.sleep(0)
    await s.close()  # waits for the reply's task: a tool still running records its output
    return resp, events, s.history.snapshot()


def kinds(history) -> list[str]:
    return [h["type"] if isinstance(h, dict) else h[0] for h in history]


def test_a_runner_runs_the_call_and_the_same_reply_goes_on_with_its_output():
    runner = Runner()
    assert isinstance(runner, ToolRunner)
    resp, events, history = asyncio.run(converse(runner, {"tools": [WEATHER], "tool_choice": "required"}))
    (ended,) = [e for e in events if isinstance(e, ReplyEnded)]
    assert ended.reason == "completed" and ended.text == "It is cold." and ended.turn_id == "s-1"
    assert [r[0] for r in resp.starts] == ["s-1", "s-1.1"]  # one reply, a continuation request
    assert resp.starts[1][2]["tool_choice"] == "none" and resp.starts[1][2]["user_text"] == ""
    assert kinds(resp.starts[1][1]) == ["user", "function_call", "function_call_output"]
    assert json.loads(resp.starts[1][1][2]["output"]) == {"city": "Oslo", "temperature_c": -3}
    assert kinds(history) == ["user", "function_call", "function_call_output", "assistant"]
    (done,) = [e for e in events if isinstance(e, ToolCall) and isinstance(e.call, CallDone)]
    (out,) = [e for e in events if isinstance(e, FunctionCallOutput)]
    assert done.run_here and out.call_id == done.call.call_id and not out.error


def test_the_runners_tools_are_offered_and_the_call_loop_is_cut_at_its_limit():
    runner = Runner(max_calls=2)
    resp, events, history = asyncio.run(converse(runner))  # auto: the responder calls while it may
    assert resp.starts[0][2]["tools"] == [WEATHER] and resp.starts[0][2]["tool_choice"] == "auto"
    assert [r[2]["tool_choice"] for r in resp.starts] == ["auto", "auto", "none"]
    assert len(runner.calls) == 2 and kinds(history)[-1] == "assistant"


def test_one_call_per_need_a_repeated_call_is_not_made_and_the_reply_goes_on_in_words():
    # the model calls get_weather(Oslo) again after its output (issue 40: "the weather tool was called twice")
    runner = Runner()
    resp, events, history = asyncio.run(converse(runner, responder=CallingResponder(cities=("Oslo", "Oslo"))))
    assert [c.arguments for c in runner.calls] == ['{"city": "Oslo"}']  # run once
    (failed,) = [e.call for e in events if isinstance(e, ToolCall) and isinstance(e.call, CallFailed)]
    assert failed.error == REPEAT_ERROR and failed.call_id == "call_2"
    assert [r[2]["tool_choice"] for r in resp.starts] == ["auto", "auto", "none"]  # then no tool: words
    assert kinds(history) == ["user", "function_call", "function_call_output", "assistant"]
    (ended,) = [e for e in events if isinstance(e, ReplyEnded)]
    assert ended.reason == "completed" and ended.text == "It is cold."


def test_call_key_ignores_key_order_and_spacing():
    assert call_key("f", '{"a": 1, "b": "x"}') == call_key("f", '{"b":"x","a":1}')
    assert call_key("f", '{"a": 1}') != call_key("f", '{"a": 2}') != call_key("g", '{"a": 2}')
    assert call_key("f", "not json") == ("f", "not json")


def test_a_failing_tool_becomes_an_error_output_and_the_reply_goes_on():
    forced = {"tools": [WEATHER], "tool_choice": "required"}
    resp, events, history = asyncio.run(converse(Runner(fail=True), forced))
    (out,) = [e for e in events if isinstance(e, FunctionCallOutput)]
    assert out.error and json.loads(out.output) == {"error": "weather service timed out"}
    assert [e.reason for e in events if isinstance(e, ReplyEnded)] == ["completed"]


def test_barge_in_while_a_tool_runs_keeps_the_call_and_output_and_stops_the_reply():
    gate = asyncio.Event()

    async def interrupt(s, events):
        if any(isinstance(e, ToolCall) and isinstance(e.call, CallDone) for e in events):
            s.cancel_reply()  # the user talks over the tool's wait
            gate.set()
            return True
        return False

    runner = Runner(gate=gate)
    resp, events, history = asyncio.run(
        converse(runner, {"tools": [WEATHER], "tool_choice": "required"}, during=interrupt)
    )
    assert [e.reason for e in events if isinstance(e, ReplyEnded)] == ["interrupted"]
    assert len(resp.starts) == 1  # no continuation after the barge-in
    assert kinds(history) == ["user", "function_call", "function_call_output"]
    assert [e.call_id for e in events if isinstance(e, FunctionCallOutput)] == [runner.calls[0].call_id]


def test_the_llm_stage_refuses_a_repeated_call_in_a_reply_and_in_the_turn():
    from omniduplex.pipeline.stages.chat_prompt import calls_made
    from omniduplex.pipeline.stages.tool_calls import DONE, FAILED
    from omniduplex.pipeline.text.reply_text import ReplyStream

    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    other = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bergen"}}\n</tool_call>'
    stream = ReplyStream(speech=True, calls=True, max_calls=4)
    metas = [m for piece in (block, "\n", other, "\n", block, "\n") for m in stream.push(piece)]
    metas += stream.finish("stop")[0]
    done = [m[DONE].arguments for m in metas if DONE in m]
    failed = [m[FAILED].error for m in metas if FAILED in m]
    assert [json.loads(a)["city"] for a in done] == ["Oslo", "Bergen"] and failed == [REPEAT_ERROR]
    assert stream.stop == "tool_calls"  # the model is looping: the reply ends, the two calls run
    # a continuation: the turn's calls so far (after the last user message) are seeded
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "id": "c1", "function": {"name": "get_weather",
                                                                  "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "cold"}]
    made = calls_made(messages)
    assert made == {call_key("get_weather", '{"city":"Oslo"}')}
    again = ReplyStream(speech=True, calls=True, max_calls=3, made=made)
    metas = again.push(block) + again.finish("stop")[0]
    assert [m[FAILED].error for m in metas if FAILED in m] == [REPEAT_ERROR] and again.stop == "stop"
    assert calls_made(messages + [{"role": "user", "content": "And now?"}]) == set()


class RefusedRepeatResponder(CallingResponder):
    """The LLM stage's view of a looping model: its continuation's call is refused as a repeat."""

    def start(self, turn_id, waveform, history, options=None):
        options = options or {}
        if "." in turn_id and options.get("tool_choice") != "none":  # the continuation repeats the call
            self.starts.append((turn_id, history, options))
            q = self.queues[turn_id] = asyncio.Queue()
            refused = CallFailed("call_r", "get_weather", REPEAT_ERROR)
            for ev in (CallStarted("call_r", "get_weather"), refused, ReplyDone()):
                q.put_nowait(ev)
            return
        super().start(turn_id, waveform, history, options)


def test_a_repeat_refused_by_the_llm_stage_still_gets_an_answer_in_words():
    runner = Runner()
    resp, events, history = asyncio.run(converse(runner, responder=RefusedRepeatResponder()))
    assert len(runner.calls) == 1
    assert [r[2]["tool_choice"] for r in resp.starts] == ["auto", "auto", "none"]
    (ended,) = [e for e in events if isinstance(e, ReplyEnded)]
    assert ended.reason == "completed" and ended.text == "It is cold."
