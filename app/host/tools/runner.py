"""The server-side tool runner of the voice surfaces that have no client code (browser, kiosk, Twilio, SIP,
the LiveKit agent worker): runs the calls a reply makes on the operator's MCP servers
(:class:`~.mcp_client.MCPHub`) and implements :class:`~omniduplex.app.core.tools.ToolRunner`.

One runner serves every session of the server. What it adds to a bare MCP call:

- ``tools``: the declared servers' tools (OpenAI function tools), listed by :meth:`MCPToolRunner.refresh`
  at server start; ``max_calls``: the per-turn call limit that cuts a call loop.
- a failure (server down, hung past its timeout, or the tool's error) is logged and raised as
  :class:`ToolFailed`, whose message is short; the session records ``{"error": ...}`` and the reply
  apologises (:attr:`MCPToolRunner.apology_text` is the words for a fixed, spoken apology).
- ``filler_after_s`` / ``filler_text``: a call still running after this long deserves a short spoken filler
  ("One moment, let me check.") so the line is never silent; :meth:`MCPToolRunner.run_with_filler` runs a
  call and invokes a ``say`` callback at that moment (the session's way to speak it).
- Prometheus: ``omniduplex_tool_calls_total{tool,outcome}`` and ``omniduplex_tool_call_seconds{tool}``
  (:meth:`~omniduplex.app.host.metrics.ServerMetrics.observe_tool`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from omniduplex.app.core.tools import MAX_CALLS_PER_TURN, FunctionCall
from omniduplex.app.host.tools.mcp_client import MCPHub, ToolResult

log = logging.getLogger("omniduplex.tools")

FILLER_TEXT = "One moment, let me check."
APOLOGY_TEXT = "Sorry, I couldn't get that information just now."
FILLER_AFTER_S = 0.8


class ToolFailed(Exception):
    """A server-run call failed: the tool's server was down, timed out or answered an error (the message
    says which, short enough to read out in a log line)."""


class MCPToolRunner:
    """A :class:`~omniduplex.app.core.tools.ToolRunner` over MCP servers.

    Args:
        hub: the server's MCP connections (shared with the Realtime API's ``type: "mcp"`` tools).
        max_calls: most calls per user turn (the session cuts the loop past it).
        timeout_s: a call's longest wait (``None``: each server's ``timeout_s``).
        filler_after_s: a call still running after this many seconds gets :attr:`filler_text` spoken
            (:meth:`run_with_filler`); ``None`` or ``0``: never.
        metrics: the server's :class:`~omniduplex.app.host.metrics.ServerMetrics` (``None``: not counted).
    """

    def __init__(
        self,
        hub: MCPHub,
        *,
        max_calls: int = MAX_CALLS_PER_TURN,
        timeout_s: float | None = None,
        filler_after_s: float | None = FILLER_AFTER_S,
        filler_text: str = FILLER_TEXT,
        apology_text: str = APOLOGY_TEXT,
        metrics: Any = None,
    ) -> None:
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        self.hub = hub
        self.tools: list[dict] = []
        self.max_calls = max_calls
        self.timeout_s = timeout_s
        self.filler_after_s = filler_after_s
        self.filler_text = filler_text
        self.apology_text = apology_text
        self.metrics = metrics

    async def refresh(self) -> list[dict]:
        """List the servers' tools into :attr:`tools` (a server that is down contributes none); returns
        them. Call at server start and whenever the operator's servers may have changed."""
        self.tools = await self.hub.tools()
        log.info("server-side tools: %s", ", ".join(t["function"]["name"] for t in self.tools) or "none")
        return self.tools

    async def call(self, call: FunctionCall) -> ToolResult:
        """Run ``call`` on its server; never raises (malformed arguments → a failed result). Counted and
        logged."""
        try:
            args = call.parsed_arguments()
        except ValueError as exc:
            result = ToolResult(ok=False, error=f"arguments are not a JSON object: {exc}")
        else:
            result = await self.hub.call(call.name, args, self.timeout_s)
        if self.metrics is not None:
            self.metrics.observe_tool(call.name, result.ok, result.latency_s)
        log.info(
            "tool %s %s in %.0f ms%s",
            call.name,
            "ok" if result.ok else "failed",
            1000 * result.latency_s,
            "" if result.ok else f": {result.error}",
        )
        return result

    async def run(self, call: FunctionCall) -> str:
        """The :class:`~omniduplex.app.core.tools.ToolRunner` contract: the call's output text.

        Raises:
            ToolFailed: the call failed (the session records ``{"error": ...}``).
        """
        result = await self.call(call)
        if not result.ok:
            raise ToolFailed(_short(result.error or "tool failed"))
        return result.output

    async def run_with_filler(self, call: FunctionCall, say: Callable[[str], Awaitable[None] | None]) -> str:
        """:meth:`run`, calling ``say(filler_text)`` once if the call is still running after
        ``filler_after_s`` (the session speaks it; the call keeps running meanwhile).

        Raises:
            ToolFailed: as :meth:`run`.
        """
        task = asyncio.ensure_future(self.run(call))
        if self.filler_after_s:
            done, _ = await asyncio.wait({task}, timeout=self.filler_after_s)
            if not done:
                spoken = say(self.filler_text)
                if asyncio.iscoroutine(spoken) or isinstance(spoken, asyncio.Future):
                    await spoken
        return await task


def _short(error: str, limit: int = 200) -> str:
    error = " ".join(error.split())
    return error if len(error) <= limit else error[: limit - 1] + "…"

