"""Remote MCP tools on a Realtime connection (``{"type": "mcp", "server_label", "server_url", "headers",
"allowed_tools", "require_approval": "never"}`` in ``session.tools``), run by the server itself.

A client-supplied ``server_url`` is an outbound request our server makes: it is refused with an ``error``
unless the operator's allow-list admits it (``serve --mcp-allow-url``, empty by default:
:meth:`~omniduplex.app.host.tools.mcp_client.MCPConfig.url_allowed`), so no client can make the server reach
its internal network. Approval-required tools (``require_approval`` other than ``never``) are refused until
approval items are built. The connection to a URL is the host's (:class:`~omniduplex.app.host.tools.MCPHub`,
shared by every session of the server).

After ``session.update`` each server's tools are listed (an ``mcp_list_tools`` item:
``mcp_list_tools.in_progress`` → ``.completed`` or ``.failed``); they are offered to every response beside the
session's function tools. :class:`RealtimeMcp` is the session's
:class:`~omniduplex.app.core.tools.ToolRunner` for them: the model's call of an MCP tool is run here and the
reply goes on with its result in the same response (``mcp_call`` items, :mod:`.responses`); a server that is
down, hangs or errors gives ``response.mcp_call.failed`` and the model answers with the error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from omniduplex.app.core.tools import MAX_CALLS_PER_TURN, FunctionCall
from omniduplex.app.host.tools.mcp_client import MCPConnection, MCPHub
from omniduplex.app.surfaces.realtime.items import ConversationItems, StoredItem
from omniduplex.app.surfaces.wire.realtime import server_events as ev
from omniduplex.app.surfaces.wire.realtime import server_objects as so
from omniduplex.app.surfaces.wire.realtime import tool_events as te
from omniduplex.app.surfaces.wire.realtime.protocol import ProtocolError

log = logging.getLogger("omniduplex.realtime")
MCP_LIST_TOOLS = "mcp_list_tools"


def split_tools(tools: list[dict]) -> tuple[list[dict], list[tuple[int, dict]]]:
    """``tools`` as (function tools, ``(index, mcp tool)`` pairs)."""
    functions = [t for t in tools if t.get("type", "function") != "mcp"]
    return functions, [(i, t) for i, t in enumerate(tools) if t.get("type") == "mcp"]


class RealtimeMcp:
    """The MCP tools of one Realtime connection, and the runner of their calls.

    Args:
        hub: the server's MCP connections (``None``: MCP tools are refused).
        send: puts one server event on the connection's outbox.
        items: the connection's item store (the ``mcp_list_tools`` items join it).
    """

    max_calls = MAX_CALLS_PER_TURN

    def __init__(self, hub: MCPHub | None, send: Callable, items: ConversationItems) -> None:
        self.hub, self.send, self.items = hub, send, items
        self.tools: list[dict] = []  # the listed MCP tools as function tools (the ToolRunner's offer)
        self.label: dict[str, str] = {}  # tool name → its server_label
        self._conn: dict[str, MCPConnection] = {}  # tool name → its server's connection
        self._task: asyncio.Task | None = None

    def connections(self, mcp: list[tuple[int, dict]], where: str, event_id: str | None) -> list:
        """Check the ``mcp`` tools of ``where`` (``session``) and open (lazily) their connections; returns
        ``(spec, connection)`` pairs.

        Raises:
            ProtocolError: a missing ``server_label`` / ``server_url``, ``require_approval`` other than
                ``never``, or a ``server_url`` the operator's allow-list does not admit (``param`` names it).
        """
        out = []
        for i, t in mcp:
            at = f"{where}.tools[{i}]"
            if not isinstance(t.get("server_label"), str) or not t["server_label"]:
                param = f"{at}.server_label"
                raise ProtocolError("invalid_value", f"{param}: required", event_id, param)
            url = t.get("server_url")
            if not isinstance(url, str) or not url:
                msg = f"{at}.server_url: required (connectors are not supported)"
                raise ProtocolError("invalid_value", msg, event_id, f"{at}.server_url")
            if t.get("require_approval", "always") != "never":
                msg = f"{at}.require_approval: approval-required MCP tools are not supported; use 'never'"
                raise ProtocolError("invalid_value", msg, event_id, f"{at}.require_approval")
            allowed = t.get("allowed_tools")
            if isinstance(allowed, dict):
                allowed = allowed.get("tool_names")
            try:
                if self.hub is None:
                    raise PermissionError("this server has no MCP client")
                conn = self.hub.connect_url(url, t.get("headers") or None, allowed)
            except (PermissionError, ValueError) as e:
                param = f"{at}.server_url"
                raise ProtocolError("invalid_value", f"{param}: {e}", event_id, param) from None
            out.append((t, conn))
        return out

    def configure(self, servers: list) -> None:
        """Offer the tools of ``servers`` (from :meth:`connections`) from now on: each is listed in the
        background (``mcp_list_tools.*`` events); until then, and if listing fails, it offers none."""
        if self._task is not None:
            self._task.cancel()
        self.tools, self.label, self._conn = [], {}, {}
        if servers:
            self._task = asyncio.get_running_loop().create_task(self._list(servers), name="realtime-mcp")

    async def _list(self, servers: list) -> None:
        try:
            await self._list_each(servers)
        except Exception:  # never lose it silently in a task
            log.exception("listing MCP tools failed")

    async def _list_each(self, servers: list) -> None:
        for spec, conn in servers:
            label = spec["server_label"]
            item_id = ev.new_id("mcpl")
            item = so.McpListToolsItem(id=item_id, server_label=label)
            prev = self.items.append(item_id, StoredItem(None, "system", MCP_LIST_TOOLS))
            self.send(ev.conversation_item_added(item, prev))
            self.send(te.McpListToolsInProgress(item_id=item_id))
            tools, err = await conn.try_list_tools()
            if err:
                log.warning("MCP server %s (%s): tools not listed: %s", label, conn.spec.url, err)
                self.send(te.McpListToolsFailed(item_id=item_id))
                continue
            for t in tools:
                fn = t["function"]
                self.tools.append({"type": "function", **fn})
                self.label[fn["name"]], self._conn[fn["name"]] = label, conn
            listed = [{"name": t["function"]["name"], "description": t["function"]["description"],
                       "input_schema": t["function"]["parameters"]} for t in tools]
            self.send(te.McpListToolsCompleted(item_id=item_id))
            self.send(ev.conversation_item_done(item.model_copy(update={"tools": listed}), None))

    def is_mcp(self, name: str) -> bool:
        """Whether ``name`` is one of the listed MCP tools."""
        return name in self._conn

    async def run(self, call: FunctionCall) -> str:
        """Call the MCP tool (:class:`~omniduplex.app.core.tools.ToolRunner`); its output text.

        Raises:
            RuntimeError: the server was down, hung past its timeout or answered an error (the message).
        """
        result = await self._conn[call.name].call(call.name, call.parsed_arguments())
        if not result.ok:
            raise RuntimeError(result.error or "MCP call failed")
        return result.output

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
