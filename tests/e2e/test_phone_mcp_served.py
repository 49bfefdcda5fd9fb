"""A server-run MCP tool on a Twilio Media Streams call to ``omniduplex serve --mcp orders[order_status]=URL
--tool-choice required`` run as a user runs it (a child process, no ``OMNIDUPLEX_*`` variable:
tests/served.py; the default model; the order MCP server, tests/mcp_order_server.py, a real process over
streamable HTTP). On ``--tool-choice auto`` the default 0.5B model answers this spoken question in words
(tried: 1.9 s of reply audio, no call), so the operator's ``required`` makes each turn call a tool first.

The caller asks, in espeak-ng's voice through G.711 μ-law, "Where is my order A 100?". What the user sees:
the MCP server received ``order_status`` with the order id, ``/metrics`` counts the call as ``ok``, and the
reply comes back as audible μ-law media on the call's websocket.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
import websockets
from speech import espeak

from omniduplex.benchmarks.phone import TwilioCaller, phone_audio

pytestmark = pytest.mark.slow
OK_METRIC = 'omniduplex_tool_calls_total{outcome="ok",tool="order_status"}'


def calls_of(log, tool: str) -> list[dict]:
    """The arguments of each ``tool`` call the MCP server received so far."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [c["arguments"] for c in map(json.loads, lines) if c["tool"] == tool]


def ok_calls(server) -> float:
    """``omniduplex_tool_calls_total{tool="order_status",outcome="ok"}`` on ``/metrics`` (0 when absent)."""
    for line in httpx.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith(OK_METRIC):
            return float(line.split()[-1])
    return 0.0


async def phone_call(server, question: np.ndarray, done, deadline_s: float = 300) -> TwilioCaller:
    """One Twilio call asking ``question`` (8 kHz int16), held until ``done()`` and the reply's audio has
    stopped arriving for 2 s (or the deadline); the caller, with what it received."""
    async with websockets.connect(server.url("/phone/twilio/stream", "ws")) as ws:
        tw = TwilioCaller(ws)
        await tw.start()
        runner = asyncio.create_task(tw.run())
        tw.say(np.zeros(4000, np.int16))
        tw.say(question)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            last = tw.received_audio_at[-1] if tw.received_audio_at else None
            if done() and last is not None and time.monotonic() - last > 2.0:
                break
            await asyncio.sleep(0.2)
        await tw.send({"event": "stop", "streamSid": tw.sid, "stop": {}})
        await asyncio.wait_for(runner, 10)
        return tw


def test_spoken_order_question_runs_the_served_mcp_tool(mcp_server, order_calls_log, tmp_path):
    before_calls, before_ok = len(calls_of(order_calls_log, "order_status")), ok_calls(mcp_server)
    question = espeak(tmp_path, "order", "Where is my order A 100?")
    assert question.size
    done = lambda: len(calls_of(order_calls_log, "order_status")) > before_calls  # noqa: E731
    tw = asyncio.run(phone_call(mcp_server, phone_audio(tmp_path / "order.wav"), done))
    calls = calls_of(order_calls_log, "order_status")[before_calls:]
    print("\n[phone/mcp] calls:", calls, "reply s:", tw.reply_seconds_played(), "media:", tw.media_messages)
    assert calls, f"the MCP server received no order_status call:\n{mcp_server.log()[-3000:]}"
    order_id = "".join(ch for ch in calls[0]["order_id"].upper() if ch.isalnum())
    assert order_id.endswith("100"), calls  # "A100" as heard ("100" when the letter is lost)
    assert ok_calls(mcp_server) == before_ok + len(calls)
    assert tw.received_audio_at, "no reply audio came back over the Twilio socket"
    assert tw.received_audio_at[-1] > tw.speech_ends[0]
    assert "Traceback" not in mcp_server.log(), mcp_server.log()[-4000:]
