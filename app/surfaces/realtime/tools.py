"""Function tools on a Realtime connection: checking ``tools`` / ``tool_choice`` (``session.update``,
``response.create``), and the tool items a client adds or retrieves (``function_call``,
``function_call_output``).

The tools reach the model through the session (:mod:`omniduplex.app.core.tools`, client-run mode): the
session's tools are offered to every response, a ``response.create`` with its own ``tools`` or
``tool_choice`` overrides them for that response. The calls come back as ``function_call`` output items
(:mod:`.responses`); the client answers each with a ``function_call_output`` item naming its ``call_id``,
then ``response.create``, and the spoken reply reads the result.
"""

from __future__ import annotations

import re

from omniduplex.app.core.history import FUNCTION_CALL, FUNCTION_CALL_OUTPUT, Entry
from omniduplex.app.core.session import Session
from omniduplex.app.surfaces.realtime.items import StoredItem
from omniduplex.app.surfaces.wire.realtime import server_objects as so
from omniduplex.app.surfaces.wire.realtime.client_events import (
    FunctionCall,
    FunctionCallOutput,
    ResponseParams,
)
from omniduplex.app.surfaces.wire.realtime.client_events import SessionConfig as RealtimeConfig
from omniduplex.app.surfaces.wire.realtime.protocol import ProtocolError
from omniduplex.models.cascade.tool_prompt import tool_set


def check_tools(tools, tool_choice, where: str, event_id: str | None) -> None:
    """Check function ``tools`` and ``tool_choice`` (:func:`~omniduplex.models.cascade.tool_prompt.tool_set`:
    names, a ``parameters`` that is a JSON Schema by its metaschema, a choice naming a given tool).

    Raises:
        ProtocolError: ``invalid_value`` whose ``param`` names the field (``session.tools[0].parameters``).
    """
    where_of = [i for i, t in enumerate(tools or []) if not (isinstance(t, dict) and t.get("type") == "mcp")]
    if len(where_of) < len(tools or []):  # a choice may need the mcp tools, listed later: checked per reply
        tool_choice = "auto"
    try:
        tool_set([tools[i] for i in where_of], tool_choice)  # mcp tools: :mod:`.mcp`
    except ValueError as e:  # name the tool by its place in the client's list
        msg = re.sub(r"^tools\[(\d+)\]", lambda m: f"tools[{where_of[int(m.group(1))]}]", str(e))
        field = msg.split(":", 1)[0]
        raise ProtocolError("invalid_value", f"{where}.{msg}", event_id, f"{where}.{field}") from None


def response_tools(p: ResponseParams | None, cfg: RealtimeConfig, event_id: str | None) -> dict | None:
    """The tool options of one response (``None``: the session's), checked: ``response.tools`` replaces the
    session's tools, ``response.tool_choice`` its choice.

    Raises:
        ProtocolError: a bad tool or choice (:func:`check_tools`).
    """
    if p is None or (p.tools is None and p.tool_choice is None):
        return None
    tools = [t for t in cfg.tools if t.get("type", "function") != "mcp"] if p.tools is None else p.tools
    for i, t in enumerate(tools):
        if isinstance(t, dict) and t.get("type") == "mcp":
            msg = f"response.tools[{i}]: mcp tools are set with session.update"
            raise ProtocolError("invalid_value", msg, event_id, f"response.tools[{i}].type")
    choice = p.tool_choice if p.tool_choice is not None else cfg.tool_choice
    check_tools(tools, choice, "response", event_id)
    return {"tools": list(tools), "tool_choice": choice}


def add_tool_item(
    session: Session, item: FunctionCall | FunctionCallOutput, item_id: str, event_id: str | None
) -> tuple[StoredItem, so.FunctionCallItem | so.FunctionCallOutputItem]:
    """Record a client's tool item in the session's history; the stored item and the item as reported.
    An output is kept as given (JSON or not: the model reads it as text).

    Raises:
        ProtocolError: a ``function_call_output`` whose ``call_id`` names no call in the conversation.
    """
    if isinstance(item, FunctionCall):
        entry = session.add_function_call(item.call_id, item.name, item.arguments)
        return StoredItem(None, "assistant", FUNCTION_CALL, entry), tool_item(item_id, entry)
    try:
        entry = session.add_function_output(item.call_id, item.output)
    except KeyError:
        raise ProtocolError(
            "invalid_value",
            f"no function_call with call_id {item.call_id!r} in the conversation",
            event_id,
            "item.call_id",
        ) from None
    return StoredItem(None, "tool", FUNCTION_CALL_OUTPUT, entry), tool_item(item_id, entry)


def tool_item(item_id: str, entry: Entry) -> so.FunctionCallItem | so.FunctionCallOutputItem:
    """A tool entry of the history (:data:`~omniduplex.app.core.history.TOOL_ROLES`) as an API item."""
    if entry.role == FUNCTION_CALL:
        return so.FunctionCallItem(id=item_id, call_id=entry.call_id, name=entry.name, arguments=entry.text)
    return so.FunctionCallOutputItem(id=item_id, call_id=entry.call_id, output=entry.text)
