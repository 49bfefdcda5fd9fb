"""The Realtime API (GA) client events: what a client builds, every SDK client event type parsed, session
updates merged, malformed and beta-era events refused with the error the API gives, unknown fields
ignored (oracle: the ``openai`` SDK's generated types, :mod:`realtime_oracle`)."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
from openai.types.realtime import RealtimeClientEvent
from openai.types.realtime.response_create_event_with_references_param import (
    ResponseCreateEventWithReferencesParam,
)
from pydantic import TypeAdapter
from realtime_oracle import (
    B64,
    CLIENT,
    FULL_SESSION_UPDATE,
    ITEM_EVENTS,
    check_server,
    full_config,
    sdk_validate,
)

from omniduplex.app.surfaces.wire.realtime.client_events import (
    CLIENT_EVENTS,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    apply_session_update,
)
from omniduplex.app.surfaces.wire.realtime.protocol import (
    ProtocolError,
    client_event_json,
    parse_client_event,
)


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
