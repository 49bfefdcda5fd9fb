"""``omniduplex agent --mcp``: the MCP tool servers the operator declares, as livekit-agents MCP servers of
each job's ``AgentSession`` (the framework lists their tools, offers them to the realtime model with the
agent's own, and runs the model's calls on them: ``livekit/agents/llm/mcp.py`` 1.8.9).

The declarations are ``serve --mcp``'s: ``NAME=URL`` (streamable HTTP) or ``NAME=COMMAND ARGS`` (stdio),
``NAME[tool1,tool2]=...`` allowing only those tools, parsed by
:meth:`~omniduplex.app.host.tools.mcp_config.MCPServerSpec.parse`. They reach the job processes in
:data:`ENV` (one declaration per line), as the worker's other settings do.
"""

from __future__ import annotations

import os

from livekit.agents.llm import mcp
from livekit.agents.llm.tool_context import get_function_info, get_raw_function_info, is_raw_function_tool

from omniduplex.app.host.tools.mcp_config import MCPServerSpec

ENV = "OMNIDUPLEX_MCP"
"""The environment variable carrying the ``--mcp`` declarations to the job processes (newline-separated)."""


def parse_specs(declarations: list[str]) -> list[MCPServerSpec]:
    """The checked servers of ``--mcp`` declarations.

    Raises:
        ValueError: a malformed declaration (:meth:`MCPServerSpec.parse`) or two servers of one name.
    """
    specs = [MCPServerSpec.parse(d) for d in declarations]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--mcp: server names must differ, got {names}")
    return specs


class _AllowedStdio(mcp.MCPServerStdio):
    """A stdio server offering only ``allowed`` tools (livekit-agents filters HTTP servers only)."""

    def __init__(self, *args, allowed: tuple[str, ...] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.allowed = set(allowed) if allowed is not None else None

    async def list_tools(self, *, tool_options=None):
        tools = await super().list_tools(tool_options=tool_options)
        if self.allowed is None:
            return tools
        return [t for t in tools if _tool_name(t) in self.allowed]


def _tool_name(tool) -> str:
    if is_raw_function_tool(tool):
        return get_raw_function_info(tool).name
    return get_function_info(tool).name


def lk_server(spec: MCPServerSpec) -> mcp.MCPServer:
    """One declared server as a livekit-agents MCP server (``spec.timeout_s``: its call timeout)."""
    if spec.url is not None:
        return mcp.MCPServerHTTP(
            spec.url,
            transport_type="streamable_http",
            allowed_tools=list(spec.allowed_tools) if spec.allowed_tools is not None else None,
            headers=dict(spec.headers),
            client_session_timeout_seconds=spec.timeout_s,
        )
    command, *args = spec.command
    env = {**os.environ, **dict(spec.env)} if spec.env else None
    return _AllowedStdio(
        command, args, env=env, client_session_timeout_seconds=spec.timeout_s, allowed=spec.allowed_tools
    )


def servers_from_env() -> list[mcp.MCPServer]:
    """The livekit-agents MCP servers of the declarations in :data:`ENV` (none when unset).

    Raises:
        ValueError: as :func:`parse_specs`.
    """
    lines = [line for line in os.environ.get(ENV, "").splitlines() if line.strip()]
    return [lk_server(s) for s in parse_specs(lines)]
