"""Tools the server reaches itself: MCP servers declared by the operator (:mod:`.mcp_client`) and the
server-side tool runner the voice surfaces use (:mod:`.runner`)."""

from omniduplex.app.host.tools.mcp_client import (
    MCPConfig,
    MCPConnection,
    MCPHub,
    MCPServerSpec,
    ToolResult,
    mcp_tool_to_openai,
)

__all__ = ["MCPConfig", "MCPConnection", "MCPHub", "MCPServerSpec", "ToolResult", "mcp_tool_to_openai"]
