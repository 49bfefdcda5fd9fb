"""``omniduplex agent --mcp``: the worker's AgentSession gets the declared MCP server's tools (a real MCP
server process, tests/mcp_order_server.py over stdio): they reach the pipeline as function tools, and the
model's call is run on the server, its output in the history the spoken reply is made from (in-memory room
audio, no LiveKit server; the pipeline scripted at the session ↔ pipeline seam)."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent  # noqa: E402
from livekit_io import MicInput, SpeakerOutput  # noqa: E402
from livekit_scripted import WORDS, ScriptedPipeline  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from omniduplex.app.core.replies import ReplyDone  # noqa: E402
from omniduplex.app.core.tools import CallArgumentsDelta, CallDone, CallStarted  # noqa: E402
from omniduplex.app.surfaces.livekit import mcp_servers, worker  # noqa: E402
from omniduplex.app.surfaces.livekit.local_model import PipelineRealtimeModel  # noqa: E402
from omniduplex.cli.main import cli  # noqa: E402

SERVER = Path(__file__).with_name("mcp_order_server.py")


class OrderPipeline(ScriptedPipeline):
    """Calls ``order_status`` when tools are offered and no output is in the history yet; else speaks."""

    def start(self, turn_id, waveform, history, options=None):
        options = options or {}
        answered = any(isinstance(h, dict) and h["type"] == "function_call_output" for h in history)
        if not options.get("tools") or answered:
            return super().start(turn_id, waveform, history, options)
        self.started.append((turn_id, history, options))
        q = self.queues[turn_id] = asyncio.Queue()
        args = '{"order_id": "A100"}'
        for ev in (CallStarted("call_mcp1", "order_status", 0), CallArgumentsDelta("call_mcp1", args),
                   CallDone("call_mcp1", "order_status", args), ReplyDone({})):
            q.put_nowait(ev)


def test_the_agent_sessions_get_the_mcp_servers_tools_and_run_the_calls_on_them(monkeypatch):
    declaration = f"orders[order_status]={shlex.quote(sys.executable)} {shlex.quote(str(SERVER))} stdio"
    monkeypatch.setenv(mcp_servers.ENV, declaration)  # as `omniduplex agent --mcp` hands it to the jobs

    async def main():
        pipeline = OrderPipeline(words=WORDS[:2])
        model = PipelineRealtimeModel(responder=pipeline, user_transcription=True)
        session = worker.make_session(model, aec_warmup_duration=None)
        session.input.audio, session.output.audio = MicInput(), SpeakerOutput()
        await model.start()
        await session.start(Agent(instructions="You track orders."))
        rt = next(iter(model.sessions))
        session.generate_reply(user_input="Where is order A100?")
        async with asyncio.timeout(60):
            while len(pipeline.started) < 2:
                await asyncio.sleep(0.05)
        history = rt.session.history.snapshot()
        await session.aclose()
        return pipeline, history

    pipeline, history = asyncio.run(main())
    offered = [t["name"] for t in pipeline.started[0][2]["tools"]]
    assert offered == ["order_status"]  # the server's other tools are not allowed by the declaration
    output = next(h for h in history if isinstance(h, dict) and h["type"] == "function_call_output")
    assert "Order A100 is shipped on Monday, arriving Thursday." in output["output"]  # run on the server


def test_agent_refuses_a_malformed_mcp_declaration():
    for bad in (["orders"], ["a=http://x/mcp", "a=http://y/mcp"], ["=cmd"]):
        args = ["agent"] + [x for b in bad for x in ("--mcp", b)] + ["start"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and "LIVEKIT_URL" not in result.output, (bad, result.output)
        assert "--mcp" in result.output or "MCP server" in result.output, (bad, result.output)
    assert [s.name for s in mcp_servers.parse_specs(["a=http://h/mcp", "b=cmd x"])] == ["a", "b"]
