"""The Realtime API's function-call argument events (GA reference; the ``openai`` SDK's
``openai.types.realtime.ResponseFunctionCallArguments{Delta,Done}Event``), and the event base they share with
:mod:`.server_events`.

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
