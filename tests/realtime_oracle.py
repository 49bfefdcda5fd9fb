"""Oracles of the Realtime protocol tests (``test_realtime_*``): the ``openai`` SDK's generated types
(``openai.types.realtime``, SDK 3.54, from OpenAI's OpenAPI spec) for event shapes. The SDK models allow
extra fields and coerce types, so :func:`sdk_validate` also requires a lossless round trip and no unknown
fields.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import numpy as np
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent, RealtimeSessionCreateResponse
from pydantic import BaseModel, TypeAdapter

from omniduplex.app.surfaces.wire.realtime.client_events import (
    SessionConfig,
    apply_session_update,
)
from omniduplex.app.surfaces.wire.realtime.protocol import (
    parse_client_event,
    parse_server_event,
)

SERVER = TypeAdapter(RealtimeServerEvent)
CLIENT = TypeAdapter(RealtimeClientEvent)
B64 = base64.b64encode(np.arange(480, dtype="<i2").tobytes()).decode()  # 10 ms of audio/pcm


def unknown_fields(m: Any, path: str = "") -> list[str]:
    """Paths of fields the SDK models kept as extras (i.e. not in the spec), recursively."""
    out = []
    if isinstance(m, BaseModel):
        out += [f"{path}.{k}" for k in (m.__pydantic_extra__ or {})]
        for k in type(m).model_fields:
            out += unknown_fields(getattr(m, k), f"{path}.{k}")
    elif isinstance(m, (list, tuple)):
        for i, v in enumerate(m):
            out += unknown_fields(v, f"{path}[{i}]")
    return out


def sdk_validate(adapter: TypeAdapter, ev: dict, allowed_extra: tuple[str, ...] = ()) -> BaseModel:
    """Validate ``ev`` with an SDK union strictly: it must parse, round-trip unchanged, and use no field
    the spec lacks (``allowed_extra``: paths of fields the SDK's model for that spot omits)."""
    wire = json.loads(json.dumps(ev))  # what goes over the socket
    m = adapter.validate_python(wire)
    assert m.model_dump(mode="json", exclude_unset=True) == wire, "the SDK coerced or dropped a field"
    extra = [p for p in unknown_fields(m) if p not in allowed_extra]
    assert not extra, f"fields not in the GA spec: {extra}"
    return m


SESSION_EXTRA = (".session.object", ".session.id")  # SessionCreatedEvent types session as the *request*


def wire(m: BaseModel) -> dict:
    """A model as it goes over the socket, decoded."""
    return json.loads(m.model_dump_json())


def check_server(event: BaseModel) -> BaseModel:
    """``event`` (one of our server event models) validates with the SDK, and parses back to itself."""
    ev = wire(event)
    assert re.fullmatch(r"event_[0-9a-f]{20}", ev["event_id"])
    m = sdk_validate(SERVER, ev, SESSION_EXTRA)
    assert m.type == ev["type"]
    if "session" in ev:  # the full session object as the GA API returns it
        sdk_validate(TypeAdapter(RealtimeSessionCreateResponse), ev["session"])
    assert parse_server_event(event.model_dump_json()) == event
    return m


def full_config() -> SessionConfig:
    upd = parse_client_event(json.dumps(FULL_SESSION_UPDATE))
    return apply_session_update(SessionConfig(id="sess_1"), upd.session)


FULL_SESSION_UPDATE = {
    "type": "session.update",
    "event_id": "evt_full",
    "session": {
        "type": "realtime",
        "model": "gpt-realtime",
        "instructions": "Be brief.",
        "output_modalities": ["audio"],
        "max_output_tokens": 512,
        "tool_choice": "auto",
        "tools": [
            {"type": "function", "name": "get_time", "description": "now", "parameters": {"type": "object"}}
        ],
        "include": ["item.input_audio_transcription.logprobs"],
        "tracing": "auto",
        "truncation": "auto",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "noise_reduction": {"type": "near_field"},
                "transcription": {"model": "whisper-1", "language": "en", "prompt": "omniduplex"},
                "turn_detection": {
                    "type": "server_vad",
                    "threshold": 0.6,
                    "prefix_padding_ms": 200,
                    "silence_duration_ms": 640,
                    "create_response": True,
                    "interrupt_response": True,
                    "idle_timeout_ms": 10000,
                },
            },
            "output": {"format": {"type": "audio/pcmu"}, "voice": "marin", "speed": 1.1},
        },
    },
}

ITEM_EVENTS = [
    {
        "type": "conversation.item.create",
        "event_id": "evt_u",
        "previous_item_id": "item_0",
        "item": {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "hello"},
                {"type": "input_audio", "audio": B64, "transcript": "what is up"},
            ],
        },
    },
    {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi"}, {"type": "output_audio", "transcript": "hi"}],
        },
    },
    {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "system",
            "status": "completed",
            "object": "realtime.item",
            "id": "item_sys",
            "content": [{"type": "input_text", "text": "be brief"}],
        },
    },
]
