"""Function tools end to end on the default cascade (SmolLM2-135M-Instruct on our engine, grammar-constrained
calls, Piper speech):

* on ``omniduplex serve`` run as a user runs it (a child process, scrubbed environment: tests/served.py), the
  official ``openai`` SDK's realtime client asks a spoken question (espeak-ng speech appended to the input
  audio buffer, committed by the server's VAD); the session's named ``tool_choice`` makes the model call
  ``get_weather`` (deterministic: the grammar forces the call and the schema), the call streams as a
  ``function_call`` item, the client answers with a ``function_call_output`` and ``response.create``, and the
  spoken reply is made over the history holding the call and its result;
* on the same server, a ``type: "mcp"`` tool the client names (an allowed URL) is run by the server;
* in-process, a session with a server-side :class:`~omniduplex.app.core.tools.ToolRunner`: it runs the call
  itself and the same reply goes on to speak, with the call and its output in the history.
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soxr
from openai import AsyncOpenAI
from speech import espeak

from omniduplex.app.core.events import FunctionCallOutput, ReplyEnded, ToolCall
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tools import CallDone, FunctionCall
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import LocalServer

pytestmark = pytest.mark.slow
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
        "required": ["city"],
    },
}
QUESTION = "What's the weather like in Paris right now?"
RESULT = '{"city": "Paris", "conditions": "sunny", "temperature_c": 21}'


@pytest.fixture(scope="module")
def inproc():
    """The app on the default cascade (in-process pipeline) under uvicorn in this process: its sessions are
    reachable, for a server-side runner of the test's own."""
    with LocalServer(create_app(ServerConfig(max_sessions=4, processes=False, max_tokens=32))) as srv:
        yield srv


async def until(conn, kind: str, events: list, timeout: float = 240.0) -> list:
    async with asyncio.timeout(timeout):
        async for e in conn:
            events.append(e)
            assert e.type != "error", e
            if e.type == kind:
                return events
    raise AssertionError(f"connection closed before {kind}")


async def speak(conn, pcm16k: np.ndarray) -> None:
    """Append ``pcm16k`` (float32, 16 kHz) as the Realtime API's default input (pcm16 at 24 kHz) in 100 ms
    pieces at about real time, then 1.5 s of silence so the server's VAD ends the turn."""
    pcm = (np.clip(soxr.resample(pcm16k, 16000, 24000), -1, 1) * 32767).astype("<i2")
    pcm = np.concatenate([pcm, np.zeros(36000, "<i2")])
    for i in range(0, pcm.size, 2400):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 2400].tobytes()).decode())
        await asyncio.sleep(0.08)


def test_spoken_function_call_round_trip_with_the_sdk(default_server, tmp_path):
    question = espeak(tmp_path, "weather", QUESTION)

    async def main():
        client = AsyncOpenAI(base_url=default_server.url("/v1"), api_key="sk-local", max_retries=0)
        async with client.realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created", [])
            named = {"type": "function", "name": "get_weather"}
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "tool_choice": named})
            await until(conn, "session.updated", [])
            await speak(conn, question)  # the VAD commits the turn and the response starts by itself
            first = await until(conn, "response.done", [])
            call = next(o for o in first[-1].response.output if o.type == "function_call")
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
            )
            await until(conn, "conversation.item.done", [])
            await conn.response.create(response={"tool_choice": "none"})
            second = await until(conn, "response.done", [])
            return first, second

    first, second = asyncio.run(main())
    assert "input_audio_buffer.committed" in [e.type for e in first]  # a spoken turn, committed by the VAD
    done = first[-1].response
    assert done.status == "completed" and [o.type for o in done.output] == ["function_call"]
    call = done.output[0]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    deltas = [e.delta for e in first if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == call.arguments  # streamed as the model wrote them
    args_done = next(e for e in first if e.type == "response.function_call_arguments.done")
    assert (args_done.call_id, args_done.name) == (call.call_id, call.name)
    assert args_done.arguments == call.arguments
    assert not any(e.type == "response.output_audio.delta" for e in first)  # a call is never spoken
    reply = second[-1].response
    assert reply.status == "completed" and [o.type for o in reply.output] == ["message"]
    audio = b"".join(base64.b64decode(e.delta) for e in second if e.type == "response.output_audio.delta")
    transcript = reply.output[0].content[0].transcript
    assert len(audio) > 2 * 24000 * 0.5 and transcript.strip()  # over half a second of speech
    print("reply after the tool:", transcript)
    log = default_server.log()
    assert "Traceback" not in log, log[-4000:]


class WeatherRunner:
    """A server-side tool runner: the weather of any city (a real async function, recording its calls)."""

    tools = [WEATHER]
    max_calls = 2

    def __init__(self) -> None:
        self.calls: list[FunctionCall] = []

    async def run(self, call: FunctionCall) -> str:
        self.calls.append(call)
        await asyncio.sleep(0.05)  # a tool that answers in 50 ms
        city = call.parsed_arguments()["city"]
        return json.dumps({"city": city, "conditions": "sunny", "temperature_c": 21})


def test_a_server_side_runner_runs_the_call_and_the_same_reply_speaks(inproc):
    runner, events = WeatherRunner(), []

    async def main():
        cfg = SessionConfig(output_rate=24000)
        session = Session("tools-srv", inproc.state.responder, events.append, cfg, tool_runner=runner)
        session.add_user_text(QUESTION)
        turn = session.respond(tools={"tools": [WEATHER], "tool_choice": "required"})
        heard = 0
        async with asyncio.timeout(240):
            while not any(isinstance(e, ReplyEnded) for e in events):
                heard += session.pull_audio(480)[1]
                await asyncio.sleep(0.005)
        history = session.history.snapshot()
        await session.close()
        return turn, heard, history

    turn, heard, history = asyncio.run_coroutine_threadsafe(main(), inproc.loop).result(300)
    ended = next(e for e in events if isinstance(e, ReplyEnded))
    assert ended.turn_id == turn and ended.reason == "completed" and heard > 24000 * 0.5
    assert len(runner.calls) >= 1 and runner.calls[0].name == "get_weather"
    done = [e for e in events if isinstance(e, ToolCall) and isinstance(e.call, CallDone)]
    outputs = [e for e in events if isinstance(e, FunctionCallOutput)]
    assert [d.call.call_id for d in done] == [c.call_id for c in runner.calls] == [o.call_id for o in outputs]
    assert all(d.run_here for d in done) and not any(o.error for o in outputs)
    kinds = [h["type"] if isinstance(h, dict) else h[0] for h in history]
    assert kinds[0] == "user" and kinds[-1] == "assistant" and "function_call" in kinds
    assert kinds.index("function_call") < kinds.index("function_call_output")
    assert "<tool_call>" not in ended.text and ended.text.strip()  # the call's text is never spoken
    print("server-run reply:", ended.text)


def test_an_mcp_tool_called_by_the_server_on_the_cascade(default_server, order_mcp_url):
    """``type: "mcp"`` on the real cascade: a forced call of the order server's tool
    (tests/mcp_order_server.py, streamable HTTP, its URL allowed by ``serve --mcp-allow-url``), run by our
    server, then the spoken reply in the same response."""

    async def main():
        client = AsyncOpenAI(base_url=default_server.url("/v1"), api_key="sk-local", max_retries=0)
        async with client.realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created", [])
            tool = {"type": "mcp", "server_label": "orders", "server_url": order_mcp_url,
                    "allowed_tools": ["order_status"], "require_approval": "never"}
            session = {"type": "realtime", "tools": [tool], "tool_choice": "required"}
            await conn.session.update(session=session)
            await until(conn, "mcp_list_tools.completed", [])
            content = [{"type": "input_text", "text": "Where is my order A100?"}]
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": content})
            await until(conn, "conversation.item.done", [])
            await conn.response.create()
            return await until(conn, "response.done", [])

    events = asyncio.run(main())
    done = events[-1].response
    kinds = [o.type for o in done.output]
    assert done.status == "completed" and kinds[0] == "mcp_call" and kinds[-1] == "message", kinds
    call = done.output[0]
    assert call.name == "order_status" and "order_id" in json.loads(call.arguments)
    assert (call.output is not None) != (call.error is not None)  # ran: a result or the tool's error
    types = [e.type for e in events]
    assert "response.mcp_call.in_progress" in types
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert len(audio) > 24000  # the reply went on to speak in the same response
    said = done.output[-1].content[0].transcript
    print("mcp call:", call.arguments, call.output or call.error, "| reply:", said)
