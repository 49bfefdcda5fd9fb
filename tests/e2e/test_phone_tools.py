"""Server-side MCP tools on a Twilio Media Streams call through the default cascade (real ASR, SmolLM2, Piper;
in-process stages) with a real MCP server process (tests/mcp_order_server.py over stdio), declared in the
serve configuration as ``serve --mcp`` does.

The 135M model is not relied on to choose a tool: the session's ``tool_choice`` names the function, so the
call is forced and its arguments are grammar-constrained; what is tested is everything around it — the
server runs the call on the MCP server, the call and its output reach the history, the reply goes on after
it, a slow call gets the spoken filler, and a hanging or failing tool is answered with the spoken apology
while the next call on the same server works. (As a user runs it, ``serve --mcp`` in a child process with
the model choosing the tool: tests/e2e/test_tools_chosen_by_the_model.py.)"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import websockets
from _phone import ServedApp
from speech import espeak

from omniduplex.app.core.session import SessionConfig
from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.host.config import tools_config
from omniduplex.app.host.tools.runner import APOLOGY_TEXT, FILLER_TEXT
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.phone import TwilioCaller, phone_audio

pytestmark = pytest.mark.slow
SERVER = Path(__file__).parents[1] / "mcp_order_server.py"


def named(name: str) -> dict:
    return {"type": "function", "name": name}


@pytest.fixture(scope="module")
def srv():
    session = SessionConfig(turn=TurnConfig(endpoint_ms=500))
    cfg = ServerConfig(session=session, processes=False, max_tokens=32)
    cfg.tools = tools_config([f"orders={sys.executable} {SERVER} stdio"], [], max_calls=2, filler_ms=800)
    cfg.tools.timeout_s = 4.0
    with ServedApp(create_app(cfg)) as s:
        yield s


async def call(srv, question: np.ndarray, deadline_s: float = 240) -> list:
    """One Twilio call that asks ``question`` (8 kHz int16); the session's history when the reply is done."""
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/phone/twilio/stream") as ws:
        tw = TwilioCaller(ws)
        await tw.start()
        runner = asyncio.create_task(tw.run())
        tw.say(np.zeros(4000, np.int16))
        tw.say(question)
        deadline = time.monotonic() + deadline_s
        while not srv.state.sessions and time.monotonic() < deadline:  # admitted once "start" is read
            await asyncio.sleep(0.05)
        session = next(c.session for c in srv.state.sessions.values())
        while time.monotonic() < deadline:
            entries = session.history.entries
            if not session.busy and any(e.role == "assistant" for e in entries):
                break
            await asyncio.sleep(0.1)
        history = list(session.history.entries)
        await tw.send({"event": "stop", "streamSid": tw.sid, "stop": {}})
        await asyncio.wait_for(runner, 10)
        return history


def ask(srv, tmp_path, name: str, text: str, tool: str) -> list:
    srv.state.cfg.session.tools = [t for t in srv.state.tool_runner.tools if t["function"]["name"] == tool]
    srv.state.cfg.session.tool_choice = named(tool)
    espeak(tmp_path, name, text)
    return asyncio.run(call(srv, phone_audio(tmp_path / f"{name}.wav")))


def test_order_question_runs_the_mcp_tool(srv, tmp_path):
    history = ask(srv, tmp_path, "order", "Where is my order A 100?", "order_status")
    kinds = [e.role for e in history]
    print("\n[phone/tools] history:", [(e.role, e.text) for e in history])
    assert kinds[0] == "user" and "function_call" in kinds and "function_call_output" in kinds
    call_entry = next(e for e in history if e.role == "function_call")
    output = next(e for e in history if e.role == "function_call_output")
    assert call_entry.name == "order_status" and output.call_id == call_entry.call_id
    check_order_answer(srv, history)


def check_order_answer(srv, history) -> None:
    """The output is the MCP server's answer to the arguments the model wrote (the 135M model writes the id
    it heard: "A100", or "102" for "one hundred"); a known order → the reply went on after the call; an
    unknown one → the tool's error is in the history and the apology was said."""
    call_entry = next(e for e in history if e.role == "function_call")
    output = next(e for e in history if e.role == "function_call_output")
    order_id = json.loads(call_entry.text)["order_id"]
    said = history[-1].text.strip()
    assert history[-1].role == "assistant" and said
    text = srv.state.prom.render().decode()
    if output.text.startswith("Order "):
        assert APOLOGY_TEXT not in said
        assert 'omniduplex_tool_calls_total{outcome="ok",tool="order_status"}' in text
    else:
        assert f"no order {order_id!r}" in output.text and said.endswith(APOLOGY_TEXT), (output.text, said)
        assert 'omniduplex_tool_calls_total{outcome="failed",tool="order_status"}' in text


def test_hanging_and_failing_tools_get_filler_and_apology(srv, tmp_path):
    history = ask(srv, tmp_path, "slow", "Please look that up for me.", "hanging_lookup")
    print("\n[phone/tools] hanging:", [(e.role, e.text) for e in history])
    output = next(e for e in history if e.role == "function_call_output")
    said = " ".join(e.text for e in history if e.role == "assistant")
    assert "timed out" in output.text  # the 4 s timeout; the 0.8 s filler came first, then the apology
    assert said.index(FILLER_TEXT) < said.index(APOLOGY_TEXT), said

    history = ask(srv, tmp_path, "broken", "Please check the database.", "broken_lookup")
    output = next(e for e in history if e.role == "function_call_output")
    said = " ".join(e.text for e in history if e.role == "assistant")
    assert "database is down" in output.text and said.replace(FILLER_TEXT, "").strip() == APOLOGY_TEXT, said

    history = ask(srv, tmp_path, "again", "Where is my order B 200?", "order_status")  # still answers
    check_order_answer(srv, history)

