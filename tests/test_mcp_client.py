"""The server's MCP client against a real MCP server process (the ``mcp`` SDK's MCPServer), over stdio and
streamable HTTP: tool listing as OpenAI function tools, calls, and the failure model (down, hanging,
erroring servers give a failed ToolResult, never an exception; other calls keep working)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omniduplex.app.host.tools import MCPConfig, MCPConnection, MCPHub, MCPServerSpec

SERVER = str(Path(__file__).with_name("mcp_order_server.py"))
ALL_TOOLS = {"order_status", "slow_lookup", "hanging_lookup", "broken_lookup"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, "MCP server process exited"
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def stdio_spec(**kw) -> MCPServerSpec:
    return MCPServerSpec(name="orders", command=(sys.executable, SERVER, "stdio"), **kw)


def test_parse_specs():
    s = MCPServerSpec.parse("orders[order_status]=python3 srv.py stdio")
    assert s.command == ("python3", "srv.py", "stdio") and s.allowed_tools == ("order_status",)
    h = MCPServerSpec.parse("crm=http://127.0.0.1:9/mcp")
    assert h.url == "http://127.0.0.1:9/mcp" and h.allowed_tools is None
    with pytest.raises(ValueError):
        MCPServerSpec.parse("no-equals-sign")
    with pytest.raises(ValueError):
        MCPServerSpec(name="x", url="ftp://host/mcp")
    cfg = MCPConfig(allow_urls=["https://tools.example.com/mcp"])
    assert cfg.url_allowed("https://tools.example.com/mcp") and cfg.url_allowed("https://tools.example.com/mcp/")
    assert not cfg.url_allowed("https://tools.example.com/mcpx") and not cfg.url_allowed("http://10.0.0.1/mcp")
    with pytest.raises(PermissionError):
        MCPHub(MCPConfig()).connect_url("http://127.0.0.1:1/mcp")


def _exercise(conn: MCPConnection):
    async def go():
        tools = await conn.list_tools()
        names = {t["function"]["name"] for t in tools}
        ok = await conn.call("order_status", {"order_id": "A100"})
        bad = await conn.call("order_status", {"order_id": "Z999"})
        broken = await conn.call("broken_lookup", {"query": "x"})
        hung = await conn.call("slow_lookup", {"seconds": 30}, timeout_s=1.0)
        after = await conn.call("order_status", {"order_id": "b200"})
        await conn.aclose()
        return tools, names, ok, bad, broken, hung, after

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_list_and_call(transport, request):
    if transport == "stdio":
        conn = MCPConnection(stdio_spec(), connect_timeout_s=60)
    else:
        conn = MCPConnection(MCPServerSpec(name="orders", url=request.getfixturevalue("http_server")))
    tools, names, ok, bad, broken, hung, after = _exercise(conn)
    assert names >= ALL_TOOLS
    spec = next(t for t in tools if t["function"]["name"] == "order_status")
    assert spec["type"] == "function"
    assert spec["function"]["parameters"]["properties"]["order_id"]["type"] == "string"
    assert "order_id" in spec["function"]["parameters"]["required"]
    assert ok.ok and ok.output == "Order A100 is shipped on Monday, arriving Thursday."
    assert not bad.ok and "Z999" in bad.error
    assert not broken.ok and "database is down" in broken.error
    assert not hung.ok and "timed out" in hung.error
    assert after.ok and after.output == "Order B200 is being packed.", after  # the connection survived


def test_allowed_tools_filter():
    async def go():
        conn = MCPConnection(stdio_spec(allowed_tools=("order_status",)), connect_timeout_s=60)
        tools = await conn.list_tools()
        refused = await conn.call("broken_lookup", {"query": "x"})
        await conn.aclose()
        return tools, refused

    tools, refused = asyncio.run(go())
    assert [t["function"]["name"] for t in tools] == ["order_status"]
    assert not refused.ok and "not allowed" in refused.error


def test_down_servers_fail_cleanly_and_others_work():
    """A command that does not exist, a port nobody listens on and a server that never answers: each
    gives a failed result (no exception); the healthy server in the same hub still answers."""

    async def go():
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts, never answers: a hanging server
        hub = MCPHub(
            MCPConfig(
                servers=[
                    MCPServerSpec(name="ghost", command=("/nonexistent/mcp-server",)),
                    MCPServerSpec(name="closed", url=f"http://127.0.0.1:{free_port()}/mcp"),
                    MCPServerSpec(name="silent", url=f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"),
                    stdio_spec(),
                ]
            ),
            connect_timeout_s=20,
        )
        tools = await hub.tools()
        ok = await hub.call("order_status", {"order_id": "A100"})
        unknown = await hub.call("launch_rockets", {})
        direct = [await hub.connections[n].call("x", {}) for n in ("ghost", "closed", "silent")]
        await hub.aclose()
        silent.close()
        return tools, ok, unknown, direct

    tools, ok, unknown, direct = asyncio.run(go())
    assert {t["function"]["name"] for t in tools} == ALL_TOOLS
    assert ok.ok and "A100" in ok.output
    assert not unknown.ok and "launch_rockets" in unknown.error
    for r in direct:
        assert not r.ok and "unavailable" in r.error
