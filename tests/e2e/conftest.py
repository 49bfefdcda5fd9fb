"""Servers shared by the end-to-end tests that drive ``omniduplex serve`` as a user runs it (:mod:`served`: a
child process, scrubbed environment), started once per test session and only when a test asks for one.

* ``default_server``: ``serve`` with the default model (stage processes, the packaged weights), Realtime
  clients allowed to name the order MCP server (``order_mcp_url``) as a ``type: "mcp"`` tool;
* ``mcp_server``: ``serve`` with the default model (Qwen2.5-Coder-0.5B, which chooses a tool by itself on
  ``tool_choice: "auto"`` for a typed request) and the order MCP server declared for the voice surfaces
  (``--mcp``, with ``--tool-choice required``: each spoken turn calls it first); ``order_calls_log``: the
  file the order server appends every call it receives to.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from served import Served

from omniduplex.benchmarks.local_server import free_port

ORDER_SERVER = Path(__file__).resolve().parents[1] / "mcp_order_server.py"
"""tests/mcp_order_server.py: ``order_status`` (A100, B200) and tools that hang or fail."""


@pytest.fixture(scope="session")
def order_calls_log(tmp_path_factory) -> Path:
    """The file the order MCP server appends each call it receives to (JSON lines: tool, arguments)."""
    return tmp_path_factory.mktemp("order-mcp") / "calls.jsonl"


@pytest.fixture(scope="session")
def order_mcp_url(order_calls_log):
    """The order MCP server over streamable HTTP on a free loopback port: its URL."""
    port = free_port()
    env = {**os.environ, "ORDER_MCP_CALL_LOG": str(order_calls_log)}
    proc = subprocess.Popen(
        [sys.executable, str(ORDER_SERVER), "http", str(port)], stderr=subprocess.DEVNULL, env=env
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the MCP server did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


class _OneServer:
    """At most one shared server runs at a time (each holds a cascade's worth of memory): asking for another
    stops the one running. Tests of one server sit in modules next to each other (the MCP server's in
    test_tools_chosen_by_the_model.py), so each starts once per test session."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.server: Served | None = None

    def get(self, name: str, *args: str) -> Served:
        if self.name != name:
            self.stop()
            self.server, self.name = Served(*args).start(), name
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = self.name = None


@pytest.fixture(scope="session")
def _one_server():
    pool = _OneServer()
    yield pool
    pool.stop()


@pytest.fixture()
def default_server(_one_server, order_mcp_url) -> Served:
    return _one_server.get("default", "--max-tokens", "40", "--mcp-allow-url", order_mcp_url, "--log-level",
                           "warning")


@pytest.fixture()
def mcp_server(_one_server, order_mcp_url) -> Served:
    # over HTTP, already up: a stdio server started by serve may miss its 10 s listing on a loaded machine
    orders = f"orders[order_status]={order_mcp_url}"
    # --tool-choice required: the voice sessions' turns call a tool first (spoken on "auto", the 0.5B model
    # answers in words: tests/e2e/test_phone_mcp_served.py); chat completions still choose per request
    return _one_server.get(
        "mcp", "--max-tokens", "40", "--mcp", orders, "--tool-choice", "required", "--log-level", "warning"
    )
