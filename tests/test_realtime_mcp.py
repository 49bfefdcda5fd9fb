"""Realtime ``type: "mcp"`` tools against a real MCP server process (``tests/mcp_order_server.py`` over
streamable HTTP): the server lists the tools (``mcp_list_tools.*``), the model's call of one is run by the
server itself (``mcp_call`` item: ``response.mcp_call_arguments.*``, ``response.mcp_call.in_progress`` →
``.completed`` / ``.failed``) and the reply goes on with the result in the same response; a ``server_url``
outside the operator's allow-list and approval-required tools are refused with an ``error``. Every server
event parses with the ``openai`` SDK's models. The pipeline is scripted at the session ↔ pipeline seam."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta
from omniduplex.app.core.tools import CallArgumentsDelta, CallDone, CallStarted
from omniduplex.app.host.config import ToolsConfig
from omniduplex.app.host.tools import MCPConfig
from omniduplex.app.server import ServerConfig, create_app

pytest.importorskip("mcp")
SERVER_EVENTS = TypeAdapter(RealtimeServerEvent)
ORDER_SERVER = Path(__file__).with_name("mcp_order_server.py")


@pytest.fixture(scope="module")
def mcp_url():
    """The order server on a free port, over streamable HTTP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ORDER_SERVER), "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the MCP server did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


class McpCallingResponder:
    """Calls ``tool`` (when offered, and no output is in the history yet) with ``args``; else speaks."""

    output_rate = 24000

    def __init__(self, tool: str, args: dict) -> None:
        self.tool, self.args = tool, json.dumps(args)
        self.starts: list[tuple[str, list, dict]] = []
        self.queues: dict[str, asyncio.Queue] = {}

    def start(self, turn_id, waveform, history, options=None):
        options = options or {}
        self.starts.append((turn_id, history, options))
        q = self.queues[turn_id] = asyncio.Queue()
        offered = [t["name"] for t in options.get("tools") or []]
        answered = any(isinstance(h, dict) and h["type"] == "function_call_output" for h in history)
        if self.tool in offered and not answered:
            a = self.args
            for ev in (CallStarted("call_m1", self.tool), CallArgumentsDelta("call_m1", a[:6]),
                       CallArgumentsDelta("call_m1", a[6:]), CallDone("call_m1", self.tool, a)):
                q.put_nowait(ev)
        else:
            q.put_nowait(ReplyTextDelta("Here is what I found."))
            q.put_nowait(ReplyAudioChunk(np.full(2400, 0.1, np.float32), "Here is what I found."))
        q.put_nowait(ReplyDone())

    async def events(self, turn_id):
        q = self.queues[turn_id]
        while True:
            ev = await q.get()
            yield ev
            if isinstance(ev, ReplyDone | ReplyFailed):
                return

    def cancel(self, turn_id):
        pass


def until(ws, kind: str) -> list:
    out = []
    while True:
        e = SERVER_EVENTS.validate_python(ws.receive_json())
        out.append(e)
        if e.type in (kind, "error"):
            return out


def mcp_tool(url: str, **kw) -> dict:
    return {"type": "mcp", "server_label": "orders", "server_url": url, "require_approval": "never", **kw}


def converse(url: str, allow: list[str], tool: str, args: dict):
    resp = McpCallingResponder(tool, args)
    cfg = ServerConfig(max_sessions=2, tools=ToolsConfig(mcp=MCPConfig(allow_urls=allow)))
    with TestClient(create_app(cfg, responder=resp)) as c, c.websocket_connect("/v1/realtime") as ws:
        until(ws, "session.created")
        tools = [mcp_tool(url, allowed_tools=["order_status", "broken_lookup"])]
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "tools": tools}})
        listing = until(ws, "mcp_list_tools.completed")
        listing += until(ws, "conversation.item.done")
        content = [{"type": "input_text", "text": "Where is A100?"}]
        item = {"type": "message", "role": "user", "content": content}
        ws.send_json({"type": "conversation.item.create", "item": item})
        until(ws, "conversation.item.done")
        ws.send_json({"type": "response.create"})
        return resp, listing, until(ws, "response.done")


def test_an_mcp_tool_is_listed_called_by_the_server_and_the_reply_goes_on(mcp_url):
    resp, listing, events = converse(mcp_url, [mcp_url], "order_status", {"order_id": "A100"})
    assert [e.type for e in listing if e.type.startswith("mcp_list_tools")] == [
        "mcp_list_tools.in_progress", "mcp_list_tools.completed"]
    listed = listing[-1].item
    assert listed.type == "mcp_list_tools" and sorted(t.name for t in listed.tools) == [
        "broken_lookup", "order_status"]  # allowed_tools filters slow_lookup out
    types = [e.type for e in events]
    assert types.index("response.mcp_call_arguments.done") < types.index("response.mcp_call.in_progress")
    assert types.index("response.mcp_call.in_progress") < types.index("response.mcp_call.completed")
    assert not any(t.startswith("response.function_call") for t in types)
    done = events[-1].response
    assert done.status == "completed" and [o.type for o in done.output] == ["mcp_call", "message"]
    call = done.output[0]
    assert (call.server_label, call.name, json.loads(call.arguments)) == ("orders", "order_status",
                                                                          {"order_id": "A100"})
    assert call.output == "Order A100 is shipped on Monday, arriving Thursday." and call.error is None
    # one response: the continuation was made over the call and the server's result
    assert len(resp.starts) == 2 and resp.starts[1][0].startswith(resp.starts[0][0] + ".")
    out = next(h for h in resp.starts[1][1] if isinstance(h, dict) and h["type"] == "function_call_output")
    assert out["output"] == call.output
    assert done.output[1].content[0].transcript == "Here is what I found."


def test_a_failing_mcp_tool_is_mcp_call_failed_and_the_reply_goes_on(mcp_url):
    resp, _, events = converse(mcp_url, [mcp_url], "broken_lookup", {"query": "A100"})
    types = [e.type for e in events]
    assert "response.mcp_call.failed" in types and "response.mcp_call.completed" not in types
    call, message = events[-1].response.output
    assert call.type == "mcp_call" and "database is down" in call.error.message
    assert message.type == "message" and events[-1].response.status == "completed"


def test_urls_outside_the_allow_list_and_approval_required_tools_are_refused(mcp_url):
    cfg = ServerConfig(max_sessions=2)  # the default allow-list: empty
    with TestClient(create_app(cfg, responder=McpCallingResponder("x", {}))) as c, c.websocket_connect(
        "/v1/realtime"
    ) as ws:
        until(ws, "session.created")
        ws.send_json({"type": "session.update", "event_id": "m1",
                      "session": {"type": "realtime", "tools": [mcp_tool(mcp_url)]}})
        err = until(ws, "error")[-1].error
        assert err.param == "session.tools[0].server_url" and "allow-list" in err.message
        tools = [{"type": "function", "name": "f"}, mcp_tool(mcp_url, require_approval="always")]
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "tools": tools}})
        assert until(ws, "error")[-1].error.param == "session.tools[1].require_approval"
        ws.send_json({"type": "session.update", "session": {"type": "realtime"}})
        assert until(ws, "session.updated")[-1].session.tools == []  # nothing was applied
