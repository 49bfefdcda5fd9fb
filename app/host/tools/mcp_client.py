"""The server's MCP client: tool servers declared by the operator, one connection per server shared by
every session of the server, reached with the official ``mcp`` SDK (Model Context Protocol,
https://modelcontextprotocol.io/specification; SDK 2.x ``mcp.Client``).

Public names (stable; the Realtime API's ``type: "mcp"`` tools and the server-side tool runner use them):

- :class:`MCPServerSpec`: one server: a stdio command or a streamable-HTTP URL, headers, a tool allow-list.
- :class:`MCPConfig`: the declared servers plus the URL allow-list that admits client-supplied
  ``server_url`` s (empty by default: no client can make the server reach a URL the operator did not list).
- :class:`MCPConnection`: one live connection: :meth:`~MCPConnection.list_tools` (OpenAI function tools),
  :meth:`~MCPConnection.call` (a :class:`ToolResult`, never an exception).
- :class:`MCPHub`: all connections of a server process: merged tool list, calls routed by tool name,
  :meth:`~MCPHub.connect_url` for an allow-listed client URL, :meth:`~MCPHub.aclose`.

Failure model: a server that is down, hangs or errors gives a :class:`ToolResult` with ``ok=False`` and a
short ``error`` — never an exception into the caller's session. A broken connection is dropped and
re-opened on a later call (at most once per ``retry_s``); other servers and sessions are unaffected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from omniduplex.app.host.tools.mcp_config import MCPConfig, MCPServerSpec

log = logging.getLogger(__name__)

__all__ = [
    "MCPConfig", "MCPConnection", "MCPHub", "MCPServerSpec", "ToolResult", "mcp_tool_to_openai"
]


@dataclass
class ToolResult:
    """What one tool call gave: ``ok`` (False: the server was down, hung past its timeout, or answered an
    error), ``output`` (the tool's text, or JSON text of its structured content; ``""`` on failure),
    ``error`` (short, for logs and ``mcp_call.failed``), ``latency_s`` (wall time of the call, s)."""

    ok: bool
    output: str = ""
    error: str | None = None
    latency_s: float = 0.0


def mcp_tool_to_openai(tool: Any) -> dict[str, Any]:
    """An MCP ``Tool`` (``name``, ``description``, ``input_schema``) as an OpenAI Chat Completions function
    tool ``{"type": "function", "function": {name, description, parameters}}``."""
    schema = dict(tool.input_schema or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description or "", "parameters": schema},
    }


def _result_text(result: Any) -> str:
    texts = [c.text for c in result.content or [] if getattr(c, "type", None) == "text"]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content)
    return ""


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # an ExceptionGroup from the SDK's task group
    if isinstance(inner, (list, tuple)) and inner:
        return "; ".join(_describe(e) for e in inner)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _Unavailable(Exception):
    pass


class MCPConnection:
    """One connection to one MCP server, opened on first use and shared by every caller on this event loop.

    The SDK's client is an async context manager whose task group must live in one task: an owner task
    holds it open until :meth:`aclose`; callers on other tasks send requests through it concurrently.
    ``connect_timeout_s``: the longest the handshake and first ``tools/list`` may take. ``retry_s``: after a
    failed connect, calls fail at once (no new attempt) for this long.
    """

    def __init__(self, spec: MCPServerSpec, *, connect_timeout_s: float = 10.0, retry_s: float = 5.0) -> None:
        self.spec = spec
        self.connect_timeout_s = connect_timeout_s
        self.retry_s = retry_s
        self.last_error: str | None = None
        self._client: Any = None
        self._tools: list[Any] = []
        self._owner: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._next_try = 0.0

    @property
    def connected(self) -> bool:
        """True while the session with the server is open."""
        return self._client is not None and self._owner is not None and not self._owner.done()

    def _target(self) -> Any:
        from mcp.client.stdio import StdioServerParameters

        s = self.spec
        if s.command is not None:
            env = dict(s.env) or None
            return StdioServerParameters(command=s.command[0], args=list(s.command[1:]), env=env)
        if not s.headers:
            return s.url
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        return streamable_http_client(s.url, http_client=create_mcp_http_client(headers=dict(s.headers)))

    async def _own(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with Client(self._target()) as client:
                tools, cursor = [], None
                for _ in range(100):  # pages; a server that never ends its listing cannot hang us
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self._tools, self._client = tools, client
                ready.set_result(None)
                await stop.wait()
        except Exception as exc:  # the server's failure is reported, never raised into a session
            self.last_error = _describe(exc)
            if not ready.done():
                ready.set_exception(_Unavailable(self.last_error))
            else:
                log.warning("MCP server %r connection lost: %s", self.spec.name, self.last_error)
        finally:
            self._client = None

    async def connect(self) -> None:
        """Open the connection if it is not open (idempotent).

        Raises:
            _Unavailable: the server did not start, refused, or took longer than ``connect_timeout_s``.
        """
        if self.connected:
            return
        async with self._lock:
            if self.connected:
                return
            if time.monotonic() < self._next_try:
                raise _Unavailable(self.last_error or "unavailable")
            await self._drop()
            loop = asyncio.get_running_loop()
            ready, self._stop = loop.create_future(), asyncio.Event()
            self._owner = asyncio.create_task(self._own(ready, self._stop), name=f"mcp:{self.spec.name}")
            try:
                await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout_s)
            except (asyncio.TimeoutError, _Unavailable) as exc:
                if isinstance(exc, asyncio.TimeoutError):
                    self.last_error = f"no answer within {self.connect_timeout_s:g} s"
                self._next_try = time.monotonic() + self.retry_s
                await self._drop()
                log.warning("MCP server %r unavailable: %s", self.spec.name, self.last_error)
                raise _Unavailable(self.last_error) from None

    async def _drop(self) -> None:
        owner, self._owner = self._owner, None
        if owner is None:
            return
        if self._stop is not None:
            self._stop.set()
        # the SDK's own shutdown is bounded (stdin closed, then SIGTERM/SIGKILL of a stdio server's tree);
        # a cancel is the last resort and is not awaited past a short wait (it can be deflected)
        done, _ = await asyncio.wait({owner}, timeout=10.0)
        if not done:
            owner.cancel()
            await asyncio.wait({owner}, timeout=2.0)
        self._client = None

    def _allowed(self, name: str) -> bool:
        return self.spec.allowed_tools is None or name in self.spec.allowed_tools

    async def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools (after ``allowed_tools``) as OpenAI function tools.

        Raises:
            _Unavailable: see :meth:`connect` (use :meth:`try_list_tools` for a result instead).
        """
        await self.connect()
        return [mcp_tool_to_openai(t) for t in self._tools if self._allowed(t.name)]

    async def try_list_tools(self) -> tuple[list[dict[str, Any]], str | None]:
        """``(tools, None)``, or ``([], error)`` when the server is unavailable."""
        try:
            return await self.list_tools(), None
        except _Unavailable as exc:
            return [], str(exc)

    async def call(
        self, name: str, arguments: dict[str, Any] | None, timeout_s: float | None = None
    ) -> ToolResult:
        """Call tool ``name`` with ``arguments`` (a JSON object); never raises.

        ``timeout_s`` (default ``spec.timeout_s``): past it the call fails with ``error`` "timed out …".
        A tool outside ``allowed_tools``, a server that is down, a transport error or the tool's own error
        (``isError``) all give ``ok=False``.
        """
        t0 = time.perf_counter()
        timeout = self.spec.timeout_s if timeout_s is None else timeout_s

        def fail(msg: str) -> ToolResult:
            log.warning("MCP tool %s/%s failed: %s", self.spec.name, name, msg)
            return ToolResult(ok=False, error=msg, latency_s=time.perf_counter() - t0)

        if not self._allowed(name):
            return fail(f"tool {name!r} is not allowed on MCP server {self.spec.name!r}")
        try:
            await self.connect()
            client = self._client
            if client is None:
                raise _Unavailable(self.last_error or "connection closed")
            result = await asyncio.wait_for(
                client.call_tool(name, arguments or {}, read_timeout_seconds=timeout), timeout + 1.0
            )
        except _Unavailable as exc:
            return fail(f"MCP server {self.spec.name!r} unavailable: {exc}")
        except asyncio.TimeoutError:
            return fail(f"timed out after {timeout:g} s")
        except Exception as exc:
            from mcp.shared.exceptions import MCPError

            if isinstance(exc, MCPError) and exc.code == -32001:  # REQUEST_TIMEOUT
                return fail(f"timed out after {timeout:g} s")
            if not (isinstance(exc, MCPError) and exc.code > -32000):  # JSON-RPC errors keep the session
                await self._drop()
            return fail(_describe(exc))
        latency = time.perf_counter() - t0
        text = _result_text(result)
        if result.is_error:
            log.warning("MCP tool %s/%s returned an error: %s", self.spec.name, name, text[:200])
            return ToolResult(ok=False, output=text, error=text or "tool error", latency_s=latency)
        return ToolResult(ok=True, output=text, latency_s=latency)

    async def aclose(self) -> None:
        """Close the session (and stop a stdio server's process)."""
        async with self._lock:
            await self._drop()


class MCPHub:
    """Every MCP connection of one server process: the declared servers (``config.servers``) and
    allow-listed client URLs, each opened once and shared by all sessions."""

    def __init__(self, config: MCPConfig | None = None, *, connect_timeout_s: float = 10.0) -> None:
        self.config = config or MCPConfig()
        self.connect_timeout_s = connect_timeout_s
        self.connections = {
            s.name: MCPConnection(s, connect_timeout_s=connect_timeout_s) for s in self.config.servers
        }
        self._by_url: dict[tuple, MCPConnection] = {}
        self._owner_of: dict[str, MCPConnection] = {}

    def __bool__(self) -> bool:
        return bool(self.connections)

    async def tools(self) -> list[dict[str, Any]]:
        """All declared servers' tools as OpenAI function tools (a server that is down contributes none and
        is logged; a name two servers share goes to the first declared)."""
        out: list[dict[str, Any]] = []
        owners: dict[str, MCPConnection] = {}
        listed = await asyncio.gather(*(c.try_list_tools() for c in self.connections.values()))
        for conn, (tools, err) in zip(self.connections.values(), listed):
            if err:
                log.warning("MCP server %r: no tools (%s)", conn.spec.name, err)
            for t in tools:
                name = t["function"]["name"]
                if name in owners:
                    first = owners[name].spec.name
                    log.warning("MCP tool %r on %r shadowed by %r", name, conn.spec.name, first)
                    continue
                owners[name] = conn
                out.append(t)
        self._owner_of = owners
        return out

    async def call(
        self, name: str, arguments: dict[str, Any] | None, timeout_s: float | None = None
    ) -> ToolResult:
        """Route a call to the server that lists ``name``; never raises (an unknown tool → ``ok=False``)."""
        if name not in self._owner_of:
            await self.tools()
        conn = self._owner_of.get(name)
        if conn is None:
            return ToolResult(ok=False, error=f"no MCP server offers tool {name!r}")
        return await conn.call(name, arguments, timeout_s)

    def connect_url(
        self, url: str, headers: dict[str, str] | None = None, allowed_tools: list[str] | None = None
    ) -> MCPConnection:
        """The shared connection for a client-supplied ``server_url`` (one per URL, headers and tool set).

        Raises:
            PermissionError: ``url`` is not admitted by ``config.allow_urls``.
            ValueError: not an http(s) URL.
        """
        if not self.config.url_allowed(url):
            raise PermissionError(f"server_url {url!r} is not in the server's MCP allow-list")
        key = (url, tuple(sorted((headers or {}).items())), tuple(allowed_tools) if allowed_tools else None)
        conn = self._by_url.get(key)
        if conn is None:
            spec = MCPServerSpec(name=url, url=url, headers=key[1], allowed_tools=key[2])
            conn = self._by_url[key] = MCPConnection(spec, connect_timeout_s=self.connect_timeout_s)
        return conn

    async def aclose(self) -> None:
        """Close every connection (server shutdown)."""
        conns = list(self.connections.values()) + list(self._by_url.values())
        await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)
