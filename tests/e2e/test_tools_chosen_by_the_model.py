"""Tools the model chooses by itself (``tool_choice: "auto"``) on ``omniduplex serve --model quality --mcp
orders[order_status]=...`` run as a user runs it (a child process, no ``OMNIDUPLEX_*`` variable:
tests/served.py; Qwen2.5-Coder-0.5B: the 135M default model is not relied on to choose a tool):

* ``POST /v1/chat/completions`` with the ``openai`` SDK: the weather question comes back as ``tool_calls``;
* the Realtime API with the ``openai`` SDK's realtime client: a spoken question (espeak-ng speech appended
  to the input buffer) produces the ``function_call`` item of the registered function tool;
* a Twilio Media Streams call: the server runs the order MCP server's tool the model chose, and the
  answer is spoken on the call.

No request leaves a traceback in the server's log.
"""

from __future__ import annotations

import asyncio
import io
import json
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile
import websockets
from openai import AsyncOpenAI
from speech import espeak
from test_realtime_tools_e2e import QUESTION, WEATHER, speak, until

from omniduplex.benchmarks.phone import TwilioCaller, phone_audio

pytestmark = pytest.mark.slow
WEATHER_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
"""The Realtime ``get_weather`` tool in the Chat Completions shape."""
LISBON = [{"role": "user", "content": "What's the weather like in Lisbon right now?"}]


def no_traceback(server) -> None:
    log = server.log()
    assert "Traceback" not in log, log[-4000:]


def test_auto_tool_call_chosen_by_the_model(quality_server):
    """``tool_choice: "auto"``: the 0.5B model (``--model quality``) decides to call the tool itself."""
    client = openai.OpenAI(base_url=quality_server.url("/v1"), api_key="unused", timeout=300, max_retries=0)
    r = client.chat.completions.create(
        model="omniduplex", messages=LISBON, tools=[WEATHER_TOOL], tool_choice="auto"
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    city = json.loads(call.function.arguments)["city"]
    assert "lisbo" in city.lower(), city  # "Lisbon" (or the model's "Lisboa")
    no_traceback(quality_server)


def test_spoken_realtime_question_gets_the_function_call(quality_server, tmp_path):
    question = espeak(tmp_path, "weather", QUESTION)

    async def main():
        client = AsyncOpenAI(base_url=quality_server.url("/v1"), api_key="sk-local", max_retries=0)
        async with client.realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created", [])
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "tool_choice": "auto"})
            await until(conn, "session.updated", [])
            await speak(conn, question)  # the VAD commits the turn and the response starts by itself
            return await until(conn, "response.done", [])

    events = asyncio.run(main())
    done = events[-1].response
    calls = [o for o in done.output if o.type == "function_call"]
    assert done.status == "completed" and calls, [o.type for o in done.output]
    assert calls[0].name == "get_weather" and "paris" in json.loads(calls[0].arguments)["city"].lower()
    no_traceback(quality_server)


def metric(server, name: str) -> float:
    """The sum of the samples of metric ``name`` (label set included, e.g. ``…{tool="x"``) at /metrics."""
    text = httpx.get(server.url("/metrics"), timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_call_to_serve_runs_the_mcp_tool_the_model_chose(quality_server, tmp_path):
    """``omniduplex serve --model quality --mcp orders[order_status]=…`` as a user runs it (tests/served.py):
    a caller asks a spoken question on a Twilio Media Streams call; the model chooses the tool itself
    (``tool_choice: "auto"``, the server's default), the server runs it on the MCP server and the
    answer is spoken on the call."""
    question = phone_audio_of(tmp_path, "Where is my order A 100?")
    ran = 'omniduplex_tool_calls_total{outcome='

    async def main():
        async with websockets.connect(quality_server.url("/phone/twilio/stream", scheme="ws")) as ws:
            tw = TwilioCaller(ws)
            await tw.start()
            runner = asyncio.create_task(tw.run())
            tw.say(np.zeros(4000, np.int16))
            tw.say(question)
            deadline, heard, quiet_since = time.monotonic() + 300, 0, time.monotonic()
            while time.monotonic() < deadline:  # the call ran, and its answer played to its end
                await asyncio.sleep(0.5)
                if tw.played != heard:
                    heard, quiet_since = tw.played, time.monotonic()
                elif metric(quality_server, ran) and heard and time.monotonic() - quiet_since > 3:
                    break
            await tw.send({"event": "stop", "streamSid": tw.sid, "stop": {}})
            await asyncio.wait_for(runner, 10)
            return tw

    tw = asyncio.run(main())
    ok = metric(quality_server, 'omniduplex_tool_calls_total{outcome="ok",tool="order_status"}')
    failed = metric(quality_server, 'omniduplex_tool_calls_total{outcome="failed",tool="order_status"}')
    assert ok + failed >= 1, quality_server.log()[-3000:]  # the server ran the tool the model chose
    reply = np.concatenate([f for _, f in tw.played_audio]) if tw.played_audio else np.zeros(0, np.int16)
    assert reply.size > 8000  # over a second of audible answer on the line
    said = transcribe(quality_server, reply)
    print("\n[phone/serve] ok:", ok, "failed:", failed, "| the caller heard:", said)
    if ok and not failed:  # the order's status (shipped Monday, arriving Thursday) reached the caller
        assert any(w in said.lower() for w in ("monday", "thursday", "ship", "arriv")), said
    log = quality_server.log()
    assert "Traceback" not in log, log[-4000:]


def phone_audio_of(tmp_path, text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng, as 8 kHz int16 through G.711 μ-law."""
    espeak(tmp_path, "q", text)
    return phone_audio(tmp_path / "q.wav")


def transcribe(server, pcm8k: np.ndarray) -> str:
    """``pcm8k`` (int16) transcribed by the server's own ``POST /v1/audio/transcriptions`` (openai SDK)."""
    buf = io.BytesIO()
    soundfile.write(buf, pcm8k, 8000, format="WAV", subtype="PCM_16")
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", timeout=120, max_retries=0)
    return client.audio.transcriptions.create(model="whisper-1", file=("reply.wav", buf.getvalue())).text
