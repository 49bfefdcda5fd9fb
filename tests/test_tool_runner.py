"""The server-side tool runner (ToolRunner over MCP) against a real stdio MCP server process: outputs,
failures raised as ToolFailed (the session's apology path), the spoken filler for a slow call, Prometheus
counts per tool, and the serve options that declare servers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from omniduplex.app.core.tools import FunctionCall, ToolRunner
from omniduplex.app.host.config import HostConfig, tools_config
from omniduplex.app.host.state import ServerState
from omniduplex.app.host.tools import MCPConfig, MCPHub, MCPServerSpec
from omniduplex.app.host.tools.runner import MCPToolRunner, ToolFailed

SERVER = str(Path(__file__).with_name("mcp_order_server.py"))
ALL_TOOLS = {"order_status", "slow_lookup", "hanging_lookup", "broken_lookup"}


def test_runner_calls_fails_fills_and_counts():
    metrics = ServerState(HostConfig()).prom
    said: list[str] = []

    async def go():
        hub = MCPHub(MCPConfig([MCPServerSpec(name="orders", command=(sys.executable, SERVER, "stdio"))]))
        runner = MCPToolRunner(hub, max_calls=3, timeout_s=2.0, filler_after_s=0.3, metrics=metrics)
        assert isinstance(runner, ToolRunner)
        await runner.refresh()
        out = await runner.run(FunctionCall("call_1", "order_status", '{"order_id": "A100"}'))
        errors = []
        for name, args in [
            ("broken_lookup", '{"query": "x"}'),
            ("slow_lookup", '{"seconds": 30}'),  # hangs past the 2 s timeout
            ("order_status", '["not", "an", "object"]'),
        ]:
            with pytest.raises(ToolFailed) as e:
                await runner.run(FunctionCall("call_2", name, args))
            errors.append(str(e.value))
        slow_call = FunctionCall("call_3", "slow_lookup", '{"seconds": 1.5}')
        slow = await runner.run_with_filler(slow_call, said.append)
        quick_said: list[str] = []
        runner.filler_after_s = 20.0
        quick = await runner.run_with_filler(
            FunctionCall("call_4", "order_status", '{"order_id": "B200"}'), quick_said.append
        )
        await hub.aclose()
        return runner, out, errors, slow, quick, quick_said

    runner, out, errors, slow, quick, quick_said = asyncio.run(go())
    assert {t["function"]["name"] for t in runner.tools} == ALL_TOOLS
    assert out == "Order A100 is shipped on Monday, arriving Thursday."
    assert "database is down" in errors[0] and "timed out" in errors[1] and "JSON object" in errors[2]
    assert slow == "done after 1.5 s" and said == ["One moment, let me check."]
    assert quick == "Order B200 is being packed." and quick_said == []
    text = metrics.render().decode()
    assert 'omniduplex_tool_calls_total{outcome="ok",tool="order_status"} 2.0' in text
    assert 'omniduplex_tool_calls_total{outcome="failed",tool="broken_lookup"} 1.0' in text
    assert 'omniduplex_tool_call_seconds_count{tool="slow_lookup"} 2.0' in text


def test_serve_options():
    cfg = tools_config(["orders[order_status]=python3 srv.py", "crm=http://127.0.0.1:9/mcp"], [], 2, 500)
    assert [s.name for s in cfg.mcp.servers] == ["orders", "crm"] and cfg.max_calls == 2
    assert cfg.filler_after_s == 0.5 and cfg.mcp.servers[0].allowed_tools == ("order_status",)
    with pytest.raises(ValueError, match="names must differ"):
        tools_config(["a=x", "a=y"], [])
