"""The Realtime API's function-call argument events (GA reference; the ``openai`` SDK's
``openai.types.realtime.ResponseFunctionCallArguments{Delta,Done}Event``), and the event base they share with
:mod:`.server_events`.

An MCP tool call the server makes itself (Realtime ``type: "mcp"`` tools) is an ``mcp_call`` output item:
``response.output_item.added``, ``response.mcp_call_arguments.delta`` / ``.done``,
``response.mcp_call.in_progress``, then ``response.mcp_call.completed`` or ``.failed`` and
``response.output_item.done`` with its ``output`` or ``error``. Listing a server's tools after
``session.update``: ``mcp_list_tools.in_progress`` then ``.completed`` or ``.failed`` on the
``mcp_list_tools`` item.

A call in a response is a ``function_call`` output item (:class:`~.server_objects.FunctionCallItem`):
``response.output_item.added`` (``arguments`` "", ``status: in_progress``), then
``response.function_call_arguments.delta`` as the model writes them, ``response.function_call_arguments.done``
(the whole ``arguments`` and the function's ``name``), then ``response.output_item.done``.
"""

from __future__ import annotations

import secrets
from typing import Literal

from pydantic import Field

from omniduplex.app.surfaces.wire.realtime.server_objects import WireModel


def new_id(prefix: str) -> str:
    """A fresh id ``<prefix>_<20 hex digits>`` (80 random bits)."""
    return f"{prefix}_{secrets.token_hex(10)}"


class _Event(WireModel):
    event_id: str = Field(default_factory=lambda: new_id("event"))
    """This event's own id (fresh for each event)."""


class ResponseFunctionCallArgumentsDelta(_Event):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDone(_Event):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


def function_call_arguments_delta(
    response_id: str, item_id: str, output_index: int, call_id: str, delta: str
) -> ResponseFunctionCallArgumentsDelta:
    return ResponseFunctionCallArgumentsDelta(
        response_id=response_id, item_id=item_id, output_index=output_index, call_id=call_id, delta=delta
    )


def function_call_arguments_done(
    response_id: str, item_id: str, output_index: int, call_id: str, name: str, arguments: str
) -> ResponseFunctionCallArgumentsDone:
    return ResponseFunctionCallArgumentsDone(
        response_id=response_id,
        item_id=item_id,
        output_index=output_index,
        call_id=call_id,
        name=name,
        arguments=arguments,
    )


class _McpListTools(_Event):
    item_id: str


class McpListToolsInProgress(_McpListTools):
    type: Literal["mcp_list_tools.in_progress"] = "mcp_list_tools.in_progress"


class McpListToolsCompleted(_McpListTools):
    type: Literal["mcp_list_tools.completed"] = "mcp_list_tools.completed"


class McpListToolsFailed(_McpListTools):
    type: Literal["mcp_list_tools.failed"] = "mcp_list_tools.failed"


class ResponseMcpCallArgumentsDelta(_Event):
    type: Literal["response.mcp_call_arguments.delta"] = "response.mcp_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    delta: str


class ResponseMcpCallArgumentsDone(_Event):
    type: Literal["response.mcp_call_arguments.done"] = "response.mcp_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    arguments: str


class _McpCall(_Event):
    item_id: str
    output_index: int


class ResponseMcpCallInProgress(_McpCall):
    type: Literal["response.mcp_call.in_progress"] = "response.mcp_call.in_progress"


class ResponseMcpCallCompleted(_McpCall):
    type: Literal["response.mcp_call.completed"] = "response.mcp_call.completed"


class ResponseMcpCallFailed(_McpCall):
    type: Literal["response.mcp_call.failed"] = "response.mcp_call.failed"


TOOL_EVENTS = (
    ResponseFunctionCallArgumentsDelta,
    ResponseFunctionCallArgumentsDone,
    McpListToolsInProgress,
    McpListToolsCompleted,
    McpListToolsFailed,
    ResponseMcpCallArgumentsDelta,
    ResponseMcpCallArgumentsDone,
    ResponseMcpCallInProgress,
    ResponseMcpCallCompleted,
    ResponseMcpCallFailed,
)
