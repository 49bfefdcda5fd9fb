"""The Realtime API (GA) protocol module against the ``openai`` SDK's generated types, and its audio codecs.

Oracles: ``openai.types.realtime`` (SDK 3.54, generated from OpenAI's OpenAPI spec) for event shapes;
CPython's ``audioop`` (deprecated, still in 3.11/3.12) for G.711. The SDK models allow extra fields and
coerce types, so :func:`sdk_validate` also requires a lossless round trip and no unknown fields.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import warnings
from typing import Any, get_args

import numpy as np
import pytest
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent, RealtimeSessionCreateResponse
from openai.types.realtime.response_create_event_with_references_param import (
    ResponseCreateEventWithReferencesParam,
)
from pydantic import BaseModel, TypeAdapter, ValidationError

from omniduplex.app.core.audio import to_float32
from omniduplex.app.surfaces.wire.realtime import audio
from omniduplex.app.surfaces.wire.realtime import server_events as S
from omniduplex.app.surfaces.wire.realtime.client_events import (
    CLIENT_EVENTS,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    ResponseCancel,
    ResponseCreate,
    SessionConfig,
    SessionUpdate,
    apply_session_update,
)
from omniduplex.app.surfaces.wire.realtime.protocol import (
    ProtocolError,
    client_event_json,
    parse_client_event,
    parse_server_event,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")

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


# -- server events -----------------------------------------------------------------------------------
def full_config() -> SessionConfig:
    upd = parse_client_event(json.dumps(FULL_SESSION_UPDATE))
    return apply_session_update(SessionConfig(id="sess_1"), upd.session)


def audio_response_events(status: str = "completed") -> list[BaseModel]:
    """One audio response, in the documented order."""
    rid, iid, prev = "resp_1", "item_2", "item_1"
    fmt = {"type": "audio/pcm", "rate": 24000}
    meta = {"turn": "7"}
    common = dict(conversation_id="conv_1", metadata=meta, voice="alloy", output_format=fmt)
    item = S.message_item(iid, "assistant", [], "in_progress")
    final = S.message_item(iid, "assistant", [S.output_audio("Hello there.")], "completed")
    usage = S.usage_object(
        input_text_tokens=10, input_audio_tokens=40, output_text_tokens=5, output_audio_tokens=30
    )
    details = None if status == "completed" else S.status_details("cancelled", "turn_detected")
    return [
        S.response_created(S.response_object(rid, **common)),
        S.response_output_item_added(rid, item),
        S.conversation_item_added(item, prev),
        S.response_content_part_added(rid, iid, S.audio_part()),
        S.response_output_audio_delta(rid, iid, b"\x00\x01" * 480),
        S.response_output_audio_transcript_delta(rid, iid, "Hello "),
        S.response_output_audio_delta(rid, iid, B64),
        S.response_output_audio_transcript_delta(rid, iid, "there."),
        S.response_output_audio_done(rid, iid),
        S.response_output_audio_transcript_done(rid, iid, "Hello there."),
        S.response_content_part_done(rid, iid, S.audio_part("Hello there.")),
        S.response_output_item_done(rid, final),
        S.conversation_item_done(final, prev),
        S.response_done(
            S.response_object(
                rid, status=status, output=[final], usage=usage, status_details=details, **common
            )
        ),
    ]


def test_audio_response_events_validate_in_order():
    evs = audio_response_events()
    models = [check_server(ev) for ev in evs]
    assert [ev.type for ev in evs][:4] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert models[0].response.metadata == {"turn": "7"} and models[-1].response.status == "completed"
    assert base64.b64decode(evs[4].delta) == b"\x00\x01" * 480
    assert len({ev.event_id for ev in evs}) == len(evs)
    for ev in audio_response_events("cancelled"):
        check_server(ev)


def test_text_response_events_validate():
    rid, iid = "resp_2", "item_3"
    done = S.message_item(iid, "assistant", [S.output_text("Hi.")])
    for ev in [
        S.response_created(S.response_object(rid, output_modalities=["text"], conversation_id=None)),
        S.response_content_part_added(rid, iid, S.text_part()),
        S.response_output_text_delta(rid, iid, "Hi."),
        S.response_output_text_done(rid, iid, "Hi."),
        S.response_content_part_done(rid, iid, S.text_part("Hi.")),
        S.response_output_item_done(rid, done),
        S.response_done(
            S.response_object(
                rid,
                status="incomplete",
                status_details=S.status_details("incomplete", "max_output_tokens"),
                output=[done],
            )
        ),
        S.response_done(
            S.response_object(
                rid,
                status="failed",
                status_details=S.status_details(
                    "failed", error={"type": "server_error", "code": "pipeline_error", "message": "boom"}
                ),
            )
        ),
    ]:
        check_server(ev)


def test_session_and_conversation_events_validate():
    cfg = full_config()
    user = S.message_item("item_1", "user", [S.input_audio()])
    for ev in [
        S.session_created(SessionConfig(id="sess_1")),
        S.session_updated(cfg),
        S.input_audio_buffer_speech_started(1200, "item_1"),
        S.input_audio_buffer_speech_stopped(2480, "item_1"),
        S.input_audio_buffer_committed("item_1", None),
        S.input_audio_buffer_committed("item_1", "item_0"),
        S.input_audio_buffer_cleared(),
        S.conversation_item_added(user, None),
        S.conversation_item_done(S.message_item("item_1", "user", [S.input_audio("hi")]), "item_0"),
        S.conversation_item_input_audio_transcription_completed("item_1", "hi", 0, 1.28),
        S.conversation_item_input_audio_transcription_delta("item_1", " there"),
        S.conversation_item_deleted("item_1"),
        S.conversation_item_truncated("item_2", 0, 1500),
        S.conversation_item_retrieved(S.message_item("item_4", "system", [S.input_text("be brief")])),
        S.output_audio_buffer_started("resp_1"),
        S.output_audio_buffer_stopped("resp_1"),
        S.output_audio_buffer_cleared("resp_1"),
        S.error("boom", code="server_error", type="server_error"),
        ProtocolError("invalid_value", "bad", "evt_9", "session.type").to_event(),
    ]:
        check_server(ev)
    s = wire(S.session_updated(cfg))["session"]
    assert s["object"] == "realtime.session" and s["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    assert s["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 640


def test_client_items_echo_validate():
    ev = parse_client_event(json.dumps(ITEM_EVENTS[0]))
    item = S.client_item(ev.item, "item_9")
    assert wire(item)["content"][1] == {
        "type": "input_audio",
        "transcript": "what is up",
    }  # audio bytes dropped
    check_server(S.conversation_item_added(item, "item_8"))


def misbuilt_events() -> dict[str, dict]:
    """Events a buggy builder could produce, each one mistake away from a valid one."""
    delta = wire(S.response_output_audio_delta("r", "i", b"\0\0"))
    part = wire(S.response_content_part_added("r", "i", S.audio_part()))
    added = wire(S.conversation_item_added(S.message_item("i", "user", [])))
    started = wire(S.input_audio_buffer_speech_started(1200, "i"))
    return {
        "missing item_id": {k: v for k, v in delta.items() if k != "item_id"},
        "beta event name": {**delta, "type": "response.audio.delta"},
        "item content type as part": {**part, "part": {"type": "output_audio", "transcript": ""}},
        "misspelt optional field (passes the bare SDK)": {
            **added,
            "previous_item": added.pop("previous_item_id"),
        },
        "string for an integer (coerced by the bare SDK)": {**started, "audio_start_ms": "1200"},
    }


@pytest.mark.parametrize("why", misbuilt_events())
def test_oracle_catches_misbuilt_events(why):
    with pytest.raises((ValidationError, AssertionError)):
        sdk_validate(SERVER, misbuilt_events()[why])


def test_bare_sdk_adapter_is_lenient_hence_the_extra_checks():
    misspelt = {
        "type": "conversation.item.added",
        "event_id": "event_1",
        "previous_item": "x",
        "item": wire(S.message_item("i", "user", [])),
    }
    SERVER.validate_python(misspelt)  # accepted: SDK models allow extra fields
    assert unknown_fields(SERVER.validate_python(misspelt)) == [".previous_item"]


def sdk_server_classes() -> dict[str, type[BaseModel]]:
    return {
        c.model_fields["type"].annotation.__args__[0]: c for c in get_args(get_args(RealtimeServerEvent)[0])
    }


def test_every_server_event_model_is_a_ga_event_with_ga_field_names():
    sdk = sdk_server_classes()
    assert len(S.SERVER_EVENTS) == 39  # + function_call_arguments.*, mcp_list_tools.*, mcp_call*
    for kind, cls in S.SERVER_EVENTS.items():
        assert kind in sdk, f"{kind} is not a GA server event"
        assert set(cls.model_fields) <= set(sdk[kind].model_fields), kind


def test_parse_server_event_types_what_we_model_and_skips_the_rest():
    ev = parse_server_event(S.response_output_audio_delta("r", "i", b"\1\0").model_dump_json())
    assert isinstance(ev, S.ResponseOutputAudioDelta) and base64.b64decode(ev.delta) == b"\1\0"
    assert parse_server_event({"type": "rate_limits.updated", "rate_limits": []}) is None
    assert parse_server_event({"type": "response.done", "response": {"id": "r", "x": 1}}).response.id == "r"
    with pytest.raises(ValueError):
        parse_server_event({"type": "response.output_audio.delta", "response_id": "r"})  # no item_id, delta
    with pytest.raises(ValueError):
        parse_server_event("[1]")
    with pytest.raises(ValueError):
        parse_server_event(b"not json")


def test_status_details_leave_out_what_is_unset():
    assert wire(S.status_details("cancelled", "turn_detected")) == {
        "type": "cancelled",
        "reason": "turn_detected",
    }
    done = S.response_done(
        S.response_object("r", status="cancelled", status_details=S.status_details("cancelled"))
    )
    assert wire(done)["response"]["status_details"] == {"type": "cancelled"}


def test_client_events_built_from_models_are_what_the_server_parses():
    """What a client (the LiveKit remote plugin) builds: only the fields it set go out, the SDK accepts
    them, and the server's parser gives back the same event."""
    built = [
        InputAudioBufferAppend(type="input_audio_buffer.append", audio=B64),
        ResponseCreate(
            type="response.create", event_id="e1", response={"metadata": {"client_event_id": "e1"}}
        ),
        ResponseCancel(type="response.cancel"),
        ConversationItemTruncate(
            type="conversation.item.truncate", item_id="i", content_index=0, audio_end_ms=9
        ),
        SessionUpdate(
            type="session.update",
            session={
                "type": "realtime",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}},
            },
        ),
    ]
    for ev in built:
        raw = client_event_json(ev)
        sdk_validate(CLIENT, json.loads(raw))
        assert parse_client_event(raw) == ev
    assert json.loads(client_event_json(built[2])) == {"type": "response.cancel"}
    assert json.loads(client_event_json(built[4]))["session"] == {
        "type": "realtime",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}},
    }


# -- client events -----------------------------------------------------------------------------------
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

CLIENT_EXAMPLES = [
    FULL_SESSION_UPDATE,
    {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcma"},
                    "transcription": None,
                    "noise_reduction": None,
                    "turn_detection": {
                        "type": "semantic_vad",
                        "eagerness": "low",
                        "create_response": False,
                        "interrupt_response": False,
                    },
                },
                "output": {"format": {"type": "audio/pcma"}, "voice": {"id": "voice_1234"}},
            },
        },
    },
    {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}},
    {"type": "input_audio_buffer.append", "event_id": "evt_a", "audio": B64},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear", "event_id": "evt_c"},
    *ITEM_EVENTS,
    {"type": "conversation.item.delete", "item_id": "item_1"},
    {"type": "conversation.item.truncate", "item_id": "item_2", "content_index": 0, "audio_end_ms": 1500},
    {"type": "conversation.item.retrieve", "item_id": "item_2"},
    {"type": "response.create"},
    {
        "type": "response.create",
        "event_id": "evt_r",
        "response": {
            "instructions": "Say hi.",
            "output_modalities": ["audio"],
            "metadata": {"turn": "7"},
            "max_output_tokens": "inf",
            "conversation": "none",
            "input": [ITEM_EVENTS[2]["item"]],
            "tool_choice": "none",
            "tools": [],
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "cedar"}},
        },
    },
    {"type": "response.cancel"},
    {"type": "response.cancel", "response_id": "resp_1"},
    {"type": "output_audio_buffer.clear"},
]


def test_we_accept_every_sdk_client_event_type():
    sdk_types = {
        get_args(m.model_fields["type"].annotation)[0] for m in get_args(get_args(RealtimeClientEvent)[0])
    }
    assert sdk_types == set(CLIENT_EVENTS)


@pytest.mark.parametrize("raw", CLIENT_EXAMPLES, ids=lambda e: e["type"])
def test_sdk_valid_client_events_parse(raw):
    sdk_validate(CLIENT, raw)  # the example is a GA event as the SDK would send it
    for wire in (json.dumps(raw), json.dumps(raw).encode()):
        ev = parse_client_event(wire)
        assert ev.type == raw["type"] and ev.event_id == raw.get("event_id")


def test_response_input_with_item_reference_parses():
    raw = {"type": "response.create", "response": {"input": [{"type": "item_reference", "id": "item_1"}]}}
    TypeAdapter(ResponseCreateEventWithReferencesParam).validate_python(raw)
    assert parse_client_event(json.dumps(raw)).response.input[0].id == "item_1"


def test_full_session_update_fields():
    ev = parse_client_event(json.dumps(FULL_SESSION_UPDATE))
    assert isinstance(ev, SessionUpdate)
    cfg = full_config()
    assert (cfg.id, cfg.model) == ("sess_1", "omniduplex")  # server-owned
    td = cfg.audio.input.turn_detection
    assert (td.type, td.threshold, td.prefix_padding_ms, td.silence_duration_ms, td.idle_timeout_ms) == (
        "server_vad",
        0.6,
        200,
        640,
        10000,
    )
    assert cfg.audio.input.transcription.language == "en" and cfg.audio.output.format.type == "audio/pcmu"
    assert (cfg.audio.output.voice, cfg.audio.output.speed, cfg.max_output_tokens) == ("marin", 1.1, 512)
    assert cfg.tools[0]["name"] == "get_time" and cfg.instructions == "Be brief."


def test_session_update_merges_only_sent_fields():
    cfg = full_config()
    cfg2 = apply_session_update(cfg, parse_client_event(json.dumps(CLIENT_EXAMPLES[2])).session)
    assert cfg2.audio.input.turn_detection is None  # null clears
    assert cfg2.audio.input.transcription == cfg.audio.input.transcription  # untouched siblings stay
    assert cfg2.audio.output == cfg.audio.output and cfg2.instructions == "Be brief."
    cfg3 = apply_session_update(cfg2, parse_client_event(json.dumps(CLIENT_EXAMPLES[1])).session)
    assert cfg3.audio.input.turn_detection.eagerness == "low" and cfg3.audio.output.voice == "voice_1234"
    assert cfg3.audio.output.speed == 1.1 and cfg3.output_modalities == ["text"]


def user_item(*content: dict) -> dict:
    return {"type": "message", "role": "user", "content": list(content)}


def ev(eid: str, type_: str, **fields: Any) -> dict:
    return {"event_id": eid, "type": type_, **fields}


def rt_session(**fields: Any) -> dict:
    return {"type": "realtime", **fields}


MISSING, INVALID = "missing_required_parameter", "invalid_value"
MALFORMED = [  # (event or raw text, code, event_id, param)
    ('{"type": "session.update", "event_id": "e1", ', "invalid_json", "e1", None),
    (b'{"event_id": "e2", "type": "input_audio_buffer.append", "audio": "\xff"}', "invalid_json", "e2", None),
    ("[1, 2]", "invalid_event", None, None),
    ({"event_id": "e3"}, MISSING, "e3", "type"),
    (ev("e4", "response.audio.delta"), INVALID, "e4", "type"),
    (ev("e5", "transcription_session.update"), INVALID, "e5", "type"),
    (ev("e6", "conversation.item.delete"), MISSING, "e6", "item_id"),
    (ev("e7", "conversation.item.truncate", item_id="i", content_index=0, audio_end_ms="5"), INVALID, "e7",
     "audio_end_ms"),
    (ev("e8", "session.update", session={"instructions": "x"}), MISSING, "e8", "session.type"),
    (ev("e9", "session.update", session=rt_session(audio={"input": {"format": {"rate": 16000}}})), INVALID,
     "e9", "session.audio.input.format.rate"),
    (ev("e10", "conversation.item.create", item=user_item({"type": "output_text", "text": "x"})), INVALID,
     "e10", "item.content[0].type"),
    (ev("e11", "conversation.item.create", item={"type": "mcp_approval_response", "approve": True}), INVALID,
     "e11", "item"),
    (ev("e11b", "conversation.item.create", item={"type": "function_call_output", "output": ""}),
     "missing_required_parameter", "e11b", "item.call_id"),
    (ev("e12", "input_audio_buffer.append", audio="abc"), "invalid_audio", "e12", "audio"),
    (ev("e13", "session.update", session=rt_session(output_modalities=["audio", "text"])), INVALID, "e13",
     "session.output_modalities"),
    (ev("e14", "session.update", session={"type": "transcription"}), INVALID, "e14", "session.type"),
    (ev("e15", "response.create", response={"conversation": "conv_1"}), INVALID, "e15",
     "response.conversation"),
    (ev("e16", "conversation.item.create", item=user_item({"type": "input_image", "image_url": ""})), INVALID,
     "e16", "item.content[0].type"),
]  # fmt: skip


@pytest.mark.parametrize("raw, code, event_id, param", MALFORMED)
def test_malformed_client_events_raise_protocol_error(raw, code, event_id, param):
    with pytest.raises(ProtocolError) as ei:
        parse_client_event(raw if isinstance(raw, (str, bytes)) else json.dumps(raw))
    e = ei.value
    assert (e.code, e.event_id, e.param) == (code, event_id, param), repr(e)
    err = check_server(e.to_event()).error
    assert (err.type, err.code, err.event_id) == ("invalid_request_error", code, event_id)


@pytest.mark.parametrize(
    "session, beta, ga",
    [
        (
            {"modalities": ["text"], "input_audio_format": "pcm16"},
            "session.modalities",
            "session.output_modalities",
        ),
        (
            {"type": "realtime", "input_audio_format": "g711_ulaw"},
            "session.input_audio_format",
            "session.audio.input.format",
        ),
        (
            {"type": "realtime", "turn_detection": None},
            "session.turn_detection",
            "session.audio.input.turn_detection",
        ),
        ({"type": "realtime", "voice": "alloy"}, "session.voice", "session.audio.output.voice"),
    ],
)
def test_beta_session_fields_are_rejected_with_the_ga_name(session, beta, ga):
    raw = json.dumps({"type": "session.update", "event_id": "evt_beta", "session": session})
    with pytest.raises(ProtocolError) as ei:
        parse_client_event(raw)
    assert (ei.value.code, ei.value.event_id, ei.value.param) == ("unknown_parameter", "evt_beta", beta)
    assert ga in ei.value.message and "beta" in ei.value.message


def test_beta_response_fields_and_content_types_are_rejected():
    with pytest.raises(ProtocolError, match="response.output_modalities"):
        parse_client_event('{"type": "response.create", "response": {"modalities": ["text"]}}')
    beta_item = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}]}
    with pytest.raises(ProtocolError, match="output_text"):
        parse_client_event(json.dumps({"type": "conversation.item.create", "item": beta_item}))


def test_unknown_fields_are_ignored():
    ev = parse_client_event('{"type": "input_audio_buffer.commit", "future_field": 1, "event_id": "x"}')
    assert ev.event_id == "x"
    upd = parse_client_event(
        json.dumps({"type": "session.update", "session": {"type": "realtime", "foo": {}}})
    )
    assert "foo" not in upd.session.model_dump()


# -- audio -------------------------------------------------------------------------------------------
ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)


def test_g711_decode_matches_audioop():
    codes = bytes(range(256))
    for fmt, ref in (("audio/pcmu", audioop.ulaw2lin), ("audio/pcma", audioop.alaw2lin)):
        want = np.frombuffer(ref(codes, 2), "<i2")
        np.testing.assert_array_equal(audio.decode(codes, fmt), want)


def test_g711_encode_matches_audioop_for_every_sample():
    for fmt, ref in (("audio/pcmu", audioop.lin2ulaw), ("audio/pcma", audioop.lin2alaw)):
        assert audio.encode(ALL_INT16, fmt) == ref(ALL_INT16.astype("<i2").tobytes(), 2)
        assert audio.encode(ALL_INT16.astype(np.float32) / 32768, fmt) == ref(ALL_INT16.tobytes(), 2)


def test_g711_round_trips():
    codes = bytes(range(256))
    assert audio.encode(audio.decode(codes, "audio/pcma"), "audio/pcma") == codes
    again = audio.encode(audio.decode(codes, "audio/pcmu"), "audio/pcmu")
    assert [i for i in range(256) if again[i] != codes[i]] == [0x7F]  # μ-law's −0 encodes as +0 (0xFF)
    x = np.linspace(-0.9, 0.9, 4001, dtype=np.float32)
    for fmt in ("audio/pcmu", "audio/pcma"):  # 8-bit log PCM: ≤ 1/16 relative error above the linear floor
        y = to_float32(audio.decode(audio.encode(x, fmt), fmt))
        assert np.all(np.abs(y - x) <= np.abs(x) / 16 + 2**-9)


def test_pcm16_round_trip_and_errors():
    assert audio.decode(audio.encode(ALL_INT16, "audio/pcm"), "audio/pcm").tolist() == ALL_INT16.tolist()
    assert (
        audio.encode(np.array([1.5, -1.5, 0.5], np.float32), {"type": "audio/pcm"})
        == np.array([32767, -32768, 16384], "<i2").tobytes()
    )  # clipped, rounded
    with pytest.raises(ProtocolError) as ei:
        audio.decode(b"\x00\x01\x02", "audio/pcm", event_id="evt_odd")
    assert (ei.value.code, ei.value.event_id) == ("invalid_audio", "evt_odd")
    with pytest.raises(ProtocolError) as ei:
        audio.decode_payload("not base64!", "audio/pcm", event_id="evt_b64")
    assert (ei.value.code, ei.value.event_id, ei.value.param) == ("invalid_audio", "evt_b64", "audio")
    assert audio.b64decode(" AAE=\n") == b"\x00\x01"  # whitespace tolerated


def test_converters_stream_client_formats():
    rng = np.random.default_rng(2)
    x = (0.2 * rng.standard_normal(8000)).astype(np.float32)  # 1 s at 8 kHz
    payload = audio.encode(x, "audio/pcmu")
    whole = audio.decode_payload(base64.b64encode(payload).decode(), {"type": "audio/pcmu"})
    parts = [audio.decode_payload(payload[i : i + 160], "audio/pcmu") for i in range(0, len(payload), 160)]
    assert whole.dtype == np.int16 and np.array_equal(np.concatenate(parts), whole)  # 20 ms appends
    out = audio.OutputConverter("audio/pcm")  # 24 kHz session output → audio/pcm: no resampling
    pcm = (rng.integers(-3000, 3000, 480)).astype(np.int16)
    assert out.push(pcm) == pcm.astype("<i2").tobytes() and out.flush() == b""
    g711 = audio.OutputConverter("audio/pcma")
    n = len(g711.push(pcm)) + len(g711.flush())
    assert abs(n - 160) <= 2 and audio.OutputConverter.bytes_per_ms("audio/pcm") == 48.0


def test_runtime_does_not_import_openai():
    code = "import sys, omniduplex.app.surfaces.wire.realtime.audio as a, "
    code += "omniduplex.app.surfaces.wire.realtime.protocol as p; print('openai' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )


def test_server_vad_keeps_hearing_past_the_buffer_limit_and_manual_mode_is_told_to_commit():
    """With server VAD a long silence between turns must not make the session deaf: the buffer drops its
    oldest audio and every append still reaches the VAD; without VAD the client is told to commit."""
    from omniduplex.app.core.session import SessionConfig
    from omniduplex.app.surfaces.realtime.connection import RealtimeConnection, RealtimeLimits

    class Silent:
        output_rate = 24000

    conn = RealtimeConnection(
        None, "rt", Silent(), SessionConfig(), lambda: None, RealtimeLimits(max_buffer_s=1)
    )
    half_s = base64.b64encode(np.zeros(12000, "<i2").tobytes()).decode()  # 0.5 s of audio/pcm (24 kHz)
    append = json.dumps({"type": "input_audio_buffer.append", "audio": half_s})
    pushed: list[np.ndarray] = []
    conn.session.push_audio = pushed.append  # what reaches the session's VAD
    for _ in range(6):
        conn.handle(append)
    sent = [conn.outbox.get_nowait().type for _ in range(conn.outbox.qsize())]
    assert "error" not in sent and conn.buffer.samples <= 16000
    assert 148 <= len(pushed) <= 150  # all 3 s went to the VAD in 20 ms frames (less the resampler delay)
    conn.handle(
        json.dumps(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            }
        )
    )
    for _ in range(3):
        conn.handle(append)
    errors = [
        e for e in (conn.outbox.get_nowait() for _ in range(conn.outbox.qsize())) if e.type == "error"
    ]
    assert [e.error.code for e in errors] == ["input_audio_buffer_too_large"] * 3  # the buffer is full
