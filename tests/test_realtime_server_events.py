"""The Realtime API (GA) server events we build, validated by the ``openai`` SDK's generated types
(:mod:`realtime_oracle`): a response's events in order, session and conversation events, what the oracle
catches, and the parse of server events."""

from __future__ import annotations

import base64
import json
from typing import get_args

import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel, ValidationError
from realtime_oracle import (
    B64,
    ITEM_EVENTS,
    SERVER,
    check_server,
    full_config,
    sdk_validate,
    unknown_fields,
    wire,
)

from omniduplex.app.surfaces.wire.realtime import server_events as S
from omniduplex.app.surfaces.wire.realtime.client_events import (
    SessionConfig,
)
from omniduplex.app.surfaces.wire.realtime.protocol import (
    ProtocolError,
    parse_client_event,
    parse_server_event,
)


# -- server events -----------------------------------------------------------------------------------
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
