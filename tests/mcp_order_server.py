"""A real MCP server for the tool tests (the ``mcp`` SDK's ``MCPServer``, formerly FastMCP).

``python tests/mcp_order_server.py stdio`` or ``python tests/mcp_order_server.py http PORT``. Tools:
``order_status`` (a fixed table), ``slow_lookup`` (answers after ``seconds``), ``hanging_lookup`` (hangs),
``broken_lookup`` (fails). With ``$ORDER_MCP_CALL_LOG`` set, each call is appended to that file as one JSON
line ``{"tool": NAME, "arguments": {...}}`` before it runs (what a test checks the server received).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

ORDERS = {"A100": "shipped on Monday, arriving Thursday", "B200": "being packed"}

server = MCPServer("orders", log_level="WARNING")
OrderId = Annotated[str, Field(pattern="^[A-Za-z]?[0-9]{3}$")]  # a short id: a forced call stays short
Query = Annotated[str, Field(max_length=16)]


def record(tool: str, **arguments) -> None:
    """Append the call to ``$ORDER_MCP_CALL_LOG`` (one JSON line; nothing when unset)."""
    path = os.environ.get("ORDER_MCP_CALL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@server.tool()
def order_status(order_id: OrderId) -> str:
    """Look up the delivery status of an order by its id (like A100)."""
    record("order_status", order_id=order_id)
    key = "".join(ch for ch in order_id.upper() if ch.isalnum())  # "a 100" (as heard) → A100
    key = next((k for k in ORDERS if key == k or (key.isdigit() and k.endswith(key))), None)
    if key is None:
        raise ToolError(f"no order {order_id!r}")
    return f"Order {key} is {ORDERS[key]}."


@server.tool()
def slow_lookup(seconds: float) -> str:
    """Answer after ``seconds`` (a tool that is slow or hangs)."""
    record("slow_lookup", seconds=seconds)
    time.sleep(seconds)
    return f"done after {seconds:g} s"


@server.tool()
def hanging_lookup(query: Query) -> str:
    """Never answers in time (a hung backend)."""
    record("hanging_lookup", query=query)
    time.sleep(600)
    return "too late"


@server.tool()
def broken_lookup(query: Query) -> str:
    """Always fails."""
    record("broken_lookup", query=query)
    raise ToolError("database is down")


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
