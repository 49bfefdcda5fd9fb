"""Server → client events of the OpenAI Realtime API (GA), as builders returning JSON-ready dicts.

Each builder returns ``{"type": …, "event_id": "event_<hex>", …}`` with a fresh ``event_id``; the
fields are exactly the GA ones (source: the API reference's server events, mirrored by the ``openai``
SDK's ``RealtimeServerEvent``, which validates every builder's output in the tests). Plain dicts, not
models: ``response.output_audio.delta`` goes out every 20–100 ms and needs no validation on the way.
The event order of one response is documented in :mod:`.protocol`.

Ids: ``event_``, ``item_``, ``resp_``, ``sess_``, ``conv_`` + 20 hex digits (:func:`new_id`). Indices:
``output_index`` is the item's position in ``response.output``, ``content_index`` the part's in
``item.content`` (both 0 for our single-item, single-part replies). Times are ms of input audio since
the session started (``audio_start_ms``, ``audio_end_ms``) or of an item's audio (truncate).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from omniduplex.app.realtime.client_events import AssistantMessage, SessionConfig, SystemMessage, UserMessage

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]


def new_id(prefix: str) -> str:
    """A fresh id ``<prefix>_<20 hex digits>`` (80 random bits)."""
    return f"{prefix}_{secrets.token_hex(10)}"


def _event(type_: str, **fields: Any) -> dict:
    return {"type": type_, "event_id": new_id("event"), **fields}


# -- objects -----------------------------------------------------------------------------------------
def session_object(cfg: SessionConfig) -> dict:
    """The GA session object (``object: "realtime.session"``) for ``cfg``, as ``session.*`` report it."""
    return {"object": "realtime.session", **cfg.model_dump(mode="json")}


def message_item(
    item_id: str,
    role: Literal["user", "assistant", "system"],
    content: Iterable[dict],
    status: ItemStatus = "completed",
) -> dict:
    """A conversation item ``{id, object: realtime.item, type: message, status, role, content}``."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": status,
        "role": role,
        "content": list(content),
    }


def client_item(item: UserMessage | AssistantMessage | SystemMessage, item_id: str) -> dict:
    """A client-created item (``conversation.item.create``) as the server reports it: our ``item_id``,
    ``status: completed``, audio bytes dropped from its content (the API echoes only transcripts)."""
    content = [c.model_dump(exclude={"audio"}) for c in item.content]
    return message_item(item_id, item.role, content, "completed")


def input_text(text: str) -> dict:
    return {"type": "input_text", "text": text}


def input_audio(transcript: str | None = None) -> dict:
    """User audio content; ``transcript`` stays ``None`` until transcription completes."""
    return {"type": "input_audio", "transcript": transcript}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text}


def output_audio(transcript: str) -> dict:
    """Assistant audio content as items report it (the audio itself went out as deltas)."""
    return {"type": "output_audio", "transcript": transcript}


def audio_part(transcript: str = "") -> dict:
    """The ``part`` of ``response.content_part.added|done`` for audio (``audio``, not ``output_audio``)."""
    return {"type": "audio", "transcript": transcript}


def text_part(text: str = "") -> dict:
    """The part of ``response.content_part.added|done`` for text output."""
    return {"type": "text", "text": text}


def usage_object(
    *,
    input_text_tokens: int = 0,
    input_audio_tokens: int = 0,
    output_text_tokens: int = 0,
    output_audio_tokens: int = 0,
    cached_tokens: int = 0,
) -> dict:
    """``response.usage`` (token counts; totals are the sums)."""
    i, o = input_text_tokens + input_audio_tokens, output_text_tokens + output_audio_tokens
    return {
        "total_tokens": i + o,
        "input_tokens": i,
        "output_tokens": o,
        "input_token_details": {
            "text_tokens": input_text_tokens,
            "audio_tokens": input_audio_tokens,
            "cached_tokens": cached_tokens,
        },
        "output_token_details": {"text_tokens": output_text_tokens, "audio_tokens": output_audio_tokens},
    }


def status_details(
    type_: Literal["completed", "cancelled", "incomplete", "failed"],
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None,
    error: Mapping[str, str] | None = None,
) -> dict:
    """``response.status_details``: ``cancelled`` by ``turn_detected`` (barge-in) or ``client_cancelled``;
    ``incomplete`` by ``max_output_tokens``; ``failed`` with ``error {type, code, message}``."""
    out: dict[str, Any] = {"type": type_}
    if reason is not None:
        out["reason"] = reason
    if error is not None:
        out["error"] = dict(error)
    return out


def response_object(
    response_id: str,
    *,
    status: ResponseStatus = "in_progress",
    output: Iterable[dict] = (),
    conversation_id: str | None = None,
    output_modalities: Iterable[str] = ("audio",),
    metadata: Mapping[str, str] | None = None,
    usage: dict | None = None,
    status_details: dict | None = None,
    voice: str | None = None,
    output_format: dict | None = None,
    max_output_tokens: int | str = "inf",
) -> dict:
    """The GA response object ``{id, object: realtime.response, status, …}``.

    ``conversation_id``: ``None`` for an out-of-band (``conversation: "none"``) response;
    ``output_format``: e.g. ``{"type": "audio/pcm", "rate": 24000}``; ``metadata`` as the client sent it.
    """
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": status_details,
        "output": list(output),
        "conversation_id": conversation_id,
        "output_modalities": list(output_modalities),
        "max_output_tokens": max_output_tokens,
        "audio": {"output": {"format": output_format, "voice": voice}},
        "usage": usage,
        "metadata": dict(metadata) if metadata is not None else None,
    }


# -- session, input audio buffer ---------------------------------------------------------------------
def session_created(cfg: SessionConfig) -> dict:
    return _event("session.created", session=session_object(cfg))


def session_updated(cfg: SessionConfig) -> dict:
    """The full effective config after a ``session.update``."""
    return _event("session.updated", session=session_object(cfg))


def input_audio_buffer_speech_started(audio_start_ms: int, item_id: str) -> dict:
    """Speech began ``audio_start_ms`` (ms of input audio since session start, incl. prefix padding);
    ``item_id``: the user item the buffer will become when committed."""
    return _event("input_audio_buffer.speech_started", audio_start_ms=int(audio_start_ms), item_id=item_id)


def input_audio_buffer_speech_stopped(audio_end_ms: int, item_id: str) -> dict:
    return _event("input_audio_buffer.speech_stopped", audio_end_ms=int(audio_end_ms), item_id=item_id)


def input_audio_buffer_committed(item_id: str, previous_item_id: str | None = None) -> dict:
    return _event("input_audio_buffer.committed", previous_item_id=previous_item_id, item_id=item_id)


def input_audio_buffer_cleared() -> dict:
    return _event("input_audio_buffer.cleared")


# -- conversation ------------------------------------------------------------------------------------
def conversation_item_added(item: dict, previous_item_id: str | None = None) -> dict:
    """An item joined the conversation (maybe still ``in_progress``); GA replacement of beta ``created``."""
    return _event("conversation.item.added", previous_item_id=previous_item_id, item=item)


def conversation_item_done(item: dict, previous_item_id: str | None = None) -> dict:
    """An item is final (``completed`` / ``incomplete``)."""
    return _event("conversation.item.done", previous_item_id=previous_item_id, item=item)


def conversation_item_deleted(item_id: str) -> dict:
    return _event("conversation.item.deleted", item_id=item_id)


def conversation_item_truncated(item_id: str, content_index: int, audio_end_ms: int) -> dict:
    """Assistant audio ``item_id`` was cut at ``audio_end_ms`` (ms into the item's audio)."""
    return _event(
        "conversation.item.truncated",
        item_id=item_id,
        content_index=content_index,
        audio_end_ms=int(audio_end_ms),
    )


def conversation_item_retrieved(item: dict) -> dict:
    return _event("conversation.item.retrieved", item=item)


def conversation_item_input_audio_transcription_completed(
    item_id: str, transcript: str, content_index: int = 0, audio_seconds: float = 0.0
) -> dict:
    """The ASR transcript of user audio item ``item_id``; ``usage``: ``audio_seconds`` (s) transcribed."""
    return _event(
        "conversation.item.input_audio_transcription.completed",
        item_id=item_id,
        content_index=content_index,
        transcript=transcript,
        usage={"type": "duration", "seconds": float(audio_seconds)},
    )


# -- response ----------------------------------------------------------------------------------------
def response_created(response: dict) -> dict:
    """First event of a response: ``response`` from :func:`response_object` (``in_progress``, no output)."""
    return _event("response.created", response=response)


def response_done(response: dict) -> dict:
    """Last event of a response: final ``status``, ``status_details``, ``output`` items and ``usage``."""
    return _event("response.done", response=response)


def response_output_item_added(response_id: str, item: dict, output_index: int = 0) -> dict:
    return _event("response.output_item.added", response_id=response_id, output_index=output_index, item=item)


def response_output_item_done(response_id: str, item: dict, output_index: int = 0) -> dict:
    return _event("response.output_item.done", response_id=response_id, output_index=output_index, item=item)


def _part_event(type_: str, response_id: str, item_id: str, output_index: int, content_index: int, **kw: Any):
    return _event(
        type_,
        response_id=response_id,
        item_id=item_id,
        output_index=output_index,
        content_index=content_index,
        **kw,
    )


def response_content_part_added(
    response_id: str, item_id: str, part: dict, output_index: int = 0, content_index: int = 0
) -> dict:
    """Announces ``part`` (:func:`audio_part` / :func:`text_part`) before its first delta."""
    return _part_event(
        "response.content_part.added", response_id, item_id, output_index, content_index, part=part
    )


def response_content_part_done(
    response_id: str, item_id: str, part: dict, output_index: int = 0, content_index: int = 0
) -> dict:
    """The finished ``part`` (with its full transcript / text)."""
    return _part_event(
        "response.content_part.done", response_id, item_id, output_index, content_index, part=part
    )


def response_output_audio_delta(
    response_id: str, item_id: str, delta: bytes | str, output_index: int = 0, content_index: int = 0
) -> dict:
    """One chunk of output audio in the session's output format: raw ``bytes`` (base64-encoded here)
    or an already base64 ``str``."""
    if isinstance(delta, (bytes, bytearray, memoryview)):
        delta = base64.b64encode(delta).decode("ascii")
    return _part_event(
        "response.output_audio.delta", response_id, item_id, output_index, content_index, delta=delta
    )


def response_output_audio_done(
    response_id: str, item_id: str, output_index: int = 0, content_index: int = 0
) -> dict:
    return _part_event("response.output_audio.done", response_id, item_id, output_index, content_index)


def response_output_audio_transcript_delta(
    response_id: str, item_id: str, delta: str, output_index: int = 0, content_index: int = 0
) -> dict:
    return _part_event(
        "response.output_audio_transcript.delta",
        response_id,
        item_id,
        output_index,
        content_index,
        delta=delta,
    )


def response_output_audio_transcript_done(
    response_id: str, item_id: str, transcript: str, output_index: int = 0, content_index: int = 0
) -> dict:
    return _part_event(
        "response.output_audio_transcript.done",
        response_id,
        item_id,
        output_index,
        content_index,
        transcript=transcript,
    )


def response_output_text_delta(
    response_id: str, item_id: str, delta: str, output_index: int = 0, content_index: int = 0
) -> dict:
    return _part_event(
        "response.output_text.delta", response_id, item_id, output_index, content_index, delta=delta
    )


def response_output_text_done(
    response_id: str, item_id: str, text: str, output_index: int = 0, content_index: int = 0
) -> dict:
    return _part_event(
        "response.output_text.done", response_id, item_id, output_index, content_index, text=text
    )


# -- output audio buffer (playout), errors -----------------------------------------------------------
def output_audio_buffer_started(response_id: str) -> dict:
    """The client started hearing ``response_id``'s audio."""
    return _event("output_audio_buffer.started", response_id=response_id)


def output_audio_buffer_stopped(response_id: str) -> dict:
    """All of ``response_id``'s audio has been played."""
    return _event("output_audio_buffer.stopped", response_id=response_id)


def output_audio_buffer_cleared(response_id: str) -> dict:
    """Unplayed audio of ``response_id`` was dropped (``output_audio_buffer.clear`` or barge-in)."""
    return _event("output_audio_buffer.cleared", response_id=response_id)


def error(
    message: str,
    *,
    code: str | None = None,
    type: str = "invalid_request_error",  # noqa: A002 (wire name)
    param: str | None = None,
    event_id: str | None = None,
) -> dict:
    """``error {error: {type, code, message, param, event_id}}``; ``event_id`` inside is the client's
    event that caused it (the outer ``event_id`` is this event's own)."""
    body = {"type": type, "code": code, "message": message, "param": param, "event_id": event_id}
    return _event("error", error=body)
