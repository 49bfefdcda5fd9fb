"""The agent's function tools (LiveKit ``@function_tool`` s) as the session's OpenAI function tools, and
LiveKit's ``ToolChoice`` as ours (:mod:`omniduplex.app.core.tools`).

Contract (``livekit/agents/voice/agent_activity.py`` 1.8.9, realtime models): the framework hands the tools
to ``RealtimeSession.update_tools`` (and a reply's own to ``generate_reply``), reads each call the model
makes from the generation's ``function_stream`` as an ``llm.FunctionCall``, runs it, writes the call and its
``llm.FunctionCallOutput`` back with ``update_chat_ctx`` and, since the pipeline does not answer a tool result
by itself (``auto_tool_reply_generation`` false), asks for the spoken reply with ``generate_reply``.
"""

from __future__ import annotations

import logging

from livekit.agents import llm
from livekit.agents.llm.tool_context import is_function_tool, is_raw_function_tool
from livekit.agents.llm.utils import build_legacy_openai_schema

log = logging.getLogger("omniduplex.livekit")


def function_tools(tools: list) -> list[dict]:
    """OpenAI function tools (``{"type": "function", "name", "description", "parameters"}``) of LiveKit
    tools: a ``@function_tool`` by the schema LiveKit derives from its signature and docstring, a raw
    function tool by its own schema; provider tools (run by a hosted model) are skipped with a warning."""
    out = []
    for t in tools:
        if is_function_tool(t):
            out.append(build_legacy_openai_schema(t, internally_tagged=True))
        elif is_raw_function_tool(t):
            raw = t.info.raw_schema
            params = raw.get("parameters") or {"type": "object", "properties": {}}
            out.append({"type": "function", "name": raw["name"], "description": raw.get("description", ""),
                        "parameters": params})
        else:
            log.warning("tool %r is not a function tool: the pipeline cannot call it", t)
    return out


def tool_choice(choice: llm.ToolChoice | None) -> str | dict:
    """LiveKit's ``ToolChoice`` (``auto`` / ``required`` / ``none`` / ``{"type": "function", "function":
    {"name"}}``; ``None`` = auto) as the session's (``{"type": "function", "name"}`` for a named one)."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    fn = choice.get("function") or {}
    name = fn.get("name") if isinstance(fn, dict) else getattr(fn, "name", None)
    return {"type": "function", "name": name}
