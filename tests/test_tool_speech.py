"""What a caller hears around a server-run tool call: a session with the MCP tool runner over a real MCP
server process (tests/mcp_order_server.py, stdio). A call still running after ``filler_after_s`` gets the
filler said as written (a ``say`` request) before the reply goes on; a call that fails (a hung tool past
its timeout, a tool error) is answered with the fixed apology and no continuation; the calls and outputs are
in the history either way. The pipeline is scripted at the session ↔ pipeline seam (the real cascade:
tests/e2e/test_phone_tools.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from omniduplex.app.core.events import FunctionCallOutput, ReplyEnded
from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyTextDelta
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tools import CallDone, CallStarted
from omniduplex.app.host.tools import MCPConfig, MCPHub, MCPServerSpec
from omniduplex.app.host.tools.runner import APOLOGY_TEXT, FILLER_TEXT, MCPToolRunner

SERVER = str(Path(__file__).with_name("mcp_order_server.py"))
BEEP = np.full(2400, 0.1, np.float32)  # 0.1 s of reply audio


class Responder:
    """Calls ``tool`` with ``args`` while a call is allowed; says a ``say`` request as written; else answers
    "Here you go." (each text with 0.1 s of audio)."""

    output_rate = 24000

    def __init__(self, tool: str, args: str) -> None:
        self.tool, self.args = tool, args
        self.starts: list[dict] = []
        self.queues: dict[str, list] = {}

    def start(self, turn_id, waveform, history, options=None):
        options = options or {}
        self.starts.append(options)
        if "say" in options:
            evs = [ReplyTextDelta(options["say"]), ReplyAudioChunk(BEEP, options["say"])]
        elif options.get("tools") and options.get("tool_choice") != "none":
            cid = f"call_{len(self.starts)}"
            evs = [CallStarted(cid, self.tool), CallDone(cid, self.tool, self.args)]
        else:
            evs = [ReplyTextDelta("Here you go."), ReplyAudioChunk(BEEP, "Here you go.")]
        self.queues[turn_id] = [*evs, ReplyDone()]

    async def events(self, turn_id):
        for ev in self.queues.pop(turn_id):
            await asyncio.sleep(0)
            yield ev

    def cancel(self, turn_id):
        pass


async def converse(runner: MCPToolRunner, tool: str, args: str):
    resp, events = Responder(tool, args), []
    cfg = SessionConfig(output_rate=24000, tools=[t for t in runner.tools if t["function"]["name"] == tool])
    cfg.tool_choice = {"type": "function", "name": tool}
    s = Session("s", resp, events.append, cfg, tool_runner=runner)
    s.add_user_text("Can you check?")
    s.respond()
    async with asyncio.timeout(60):
        while not any(isinstance(e, ReplyEnded) for e in events):
            s.pull_audio(4800)  # play out as a surface would
            await asyncio.sleep(0.01)
    history = [(e.role, e.text) for e in s.history.entries]
    await s.close()
    return resp, events, history


@pytest.fixture(scope="module")
def runner():
    loop = asyncio.new_event_loop()
    hub = MCPHub(MCPConfig([MCPServerSpec(name="orders", command=(sys.executable, SERVER, "stdio"))]))
    r = MCPToolRunner(hub, timeout_s=2.0, filler_after_s=0.3)
    loop.run_until_complete(r.refresh())
    yield loop, r
    loop.run_until_complete(hub.aclose())
    loop.close()


def test_quick_call_no_filler_and_reply_goes_on(runner):
    loop, r = runner
    resp, events, history = loop.run_until_complete(converse(r, "order_status", '{"order_id": "A100"}'))
    assert not any("say" in o for o in resp.starts)
    assert [role for role, _ in history] == ["user", "function_call", "function_call_output", "assistant"]
    assert history[2][1].startswith("Order A100 is shipped") and history[3][1] == "Here you go."


def test_slow_call_gets_the_filler_then_the_answer(runner):
    loop, r = runner
    resp, events, history = loop.run_until_complete(converse(r, "slow_lookup", '{"seconds": 1.5}'))
    assert [o["say"].strip() for o in resp.starts if "say" in o] == [FILLER_TEXT]
    assert history[2] == ("function_call_output", "done after 1.5 s")
    said = history[-1][1]
    assert said.startswith(FILLER_TEXT) and said.endswith("Here you go."), said


@pytest.mark.parametrize("tool, args, error", [
    ("hanging_lookup", '{"query": "x"}', "timed out"),
    ("broken_lookup", '{"query": "x"}', "database is down"),
])
def test_failed_call_is_answered_with_the_apology(runner, tool, args, error):
    loop, r = runner
    resp, events, history = loop.run_until_complete(converse(r, tool, args))
    out = next(e for e in events if isinstance(e, FunctionCallOutput))
    assert out.error and error in out.output
    said = [o["say"].strip() for o in resp.starts if "say" in o]
    assert said[-1] == APOLOGY_TEXT and (tool == "broken_lookup" or said[0] == FILLER_TEXT)
    assert len(resp.starts) == 1 + len(said)  # no continuation after the apology
    assert history[-1][0] == "assistant" and history[-1][1].strip().endswith(APOLOGY_TEXT)
