"""A real MCP server for the tool tests (the ``mcp`` SDK's ``MCPServer``, formerly FastMCP).

``python tests/mcp_order_server.py stdio`` or ``python tests/mcp_order_server.py http PORT``. Tools:
``order_status`` (a fixed table), ``slow_lookup`` (answers after ``seconds``), ``hanging_lookup`` (hangs),
``broken_lookup`` (fails).
"""

from __future__ import annotations

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


@server.tool()
def order_status(order_id: OrderId) -> str:
    """Look up the delivery status of an order by its id (like A100)."""
    key = "".join(ch for ch in order_id.upper() if ch.isalnum())  # "a 100" (as heard) → A100
    key = next((k for k in ORDERS if key == k or (key.isdigit() and k.endswith(key))), None)
    if key is None:
        raise ToolError(f"no order {order_id!r}")
    return f"Order {key} is {ORDERS[key]}."


@server.tool()
def slow_lookup(seconds: float) -> str:
    """Answer after ``seconds`` (a tool that is slow or hangs)."""
    time.sleep(seconds)
    return f"done after {seconds:g} s"


@server.tool()
def hanging_lookup(query: Query) -> str:
    """Never answers in time (a hung backend)."""
    time.sleep(600)
    return "too late"


@server.tool()
def broken_lookup(query: Query) -> str:
    """Always fails."""
    raise ToolError("database is down")


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
