"""Server → client events of the OpenAI Realtime API (GA) as pydantic v2 models, and their builders.

One model per event type we emit, named after the SDK's (``openai.types.realtime``: ``SessionCreatedEvent``
→ :class:`SessionCreated`, …), with exactly the GA fields (source: the API reference's server events,
https://platform.openai.com/docs/api-reference/realtime-server-events, as generated into the ``openai`` SDK
3.57; the tests validate every model's wire form with the SDK and check its field names against the SDK's
class). The server builds them (the ``snake_case`` builders below, one per event type) and sends
``model_dump_json()``; the LiveKit remote plugin parses them back
(:func:`omniduplex.app.surfaces.wire.realtime.protocol.parse_server_event`). The event order of one response
is documented in :mod:`.protocol`.

Wire form: every field is sent, ``null`` included (``previous_item_id: null`` means "at the start"), except
``status_details.reason|error``, which are left out when unset. Unknown fields are ignored when parsing, so a
newer server's extra fields do not break an older client.

Ids: ``event_``, ``item_``, ``resp_``, ``sess_``, ``conv_`` + 20 hex digits (:func:`new_id`). Indices:
``output_index`` is the item's position in ``response.output``, ``content_index`` the part's in
``item.content`` (both 0 for our single-item, single-part replies). Times are ms of input audio since
the session started (``audio_start_ms``, ``audio_end_ms``) or of an item's audio (truncate).
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal, Union, get_args

from pydantic import Field

from omniduplex.app.surfaces.wire.realtime.client_events import SessionConfig
from omniduplex.app.surfaces.wire.realtime.server_objects import (  # noqa: F401 (the builders are re-exported)
    AnyItem,
    AudioPart,
    DurationUsage,
    ErrorBody,
    InputAudioContent,
    InputTextContent,
    InputTokenDetails,
    Item,
    ItemStatus,
    OutputAudioContent,
    OutputTextContent,
    OutputTokenDetails,
    Part,
    Response,
    ResponseAudio,
    ResponseAudioOutput,
    ResponseStatus,
    Role,
    SessionObject,
    StatusDetails,
    StatusError,
    TextPart,
    Usage,
    WireModel,
    audio_part,
    client_item,
    input_audio,
    input_text,
    message_item,
    output_audio,
    output_text,
    response_object,
    session_object,
    status_details,
    text_part,
    usage_object,
)
from omniduplex.app.surfaces.wire.realtime.tool_events import (  # noqa: E402,F401 (re-exported)
    TOOL_EVENTS,
    _Event,
    new_id,
)


class SessionCreated(_Event):
    type: Literal["session.created"] = "session.created"
    session: SessionObject


class SessionUpdated(_Event):
    """The full effective config after a ``session.update``."""

    type: Literal["session.updated"] = "session.updated"
    session: SessionObject


class InputAudioBufferSpeechStarted(_Event):
    """Speech began ``audio_start_ms`` (ms of input audio since session start, incl. prefix padding);
    ``item_id``: the user item the buffer will become when committed."""

    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStopped(_Event):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class InputAudioBufferCommitted(_Event):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    previous_item_id: str | None = None
    item_id: str


class InputAudioBufferCleared(_Event):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class ConversationItemAdded(_Event):
    """An item joined the conversation (maybe still ``in_progress``); GA replacement of beta ``created``."""

    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None = None
    item: AnyItem


class ConversationItemDone(_Event):
    """An item is final (``completed`` / ``incomplete``)."""

    type: Literal["conversation.item.done"] = "conversation.item.done"
    previous_item_id: str | None = None
    item: AnyItem


class ConversationItemDeleted(_Event):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class ConversationItemTruncated(_Event):
    """Assistant audio ``item_id`` was cut at ``audio_end_ms`` (ms into the item's audio)."""

    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int = 0
    audio_end_ms: int


class ConversationItemRetrieved(_Event):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: AnyItem


class ConversationItemInputAudioTranscriptionCompleted(_Event):
    """The ASR transcript of user audio item ``item_id``."""

    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed"
    )
    item_id: str
    content_index: int = 0
    transcript: str
    usage: DurationUsage = Field(default_factory=DurationUsage)


class ConversationItemInputAudioTranscriptionDelta(_Event):
    """Words heard so far of user audio item ``item_id`` while it is spoken: ``delta`` extends the text of
    the item's earlier deltas (joined, never revised; the ``completed`` event's ``transcript`` is the final
    word). ``logprobs`` is always ``null`` (not offered)."""

    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta"
    )
    item_id: str
    content_index: int = 0
    delta: str
    logprobs: list | None = None


class _ResponseEvent(_Event):
    response: Response


class ResponseCreated(_ResponseEvent):
    """First event of a response (``in_progress``, no output)."""

    type: Literal["response.created"] = "response.created"


class ResponseDone(_ResponseEvent):
    """Last event of a response: final ``status``, ``status_details``, ``output`` items and ``usage``."""

    type: Literal["response.done"] = "response.done"


class _OutputItemEvent(_Event):
    response_id: str
    output_index: int = 0
    item: AnyItem


class ResponseOutputItemAdded(_OutputItemEvent):
    type: Literal["response.output_item.added"] = "response.output_item.added"


class ResponseOutputItemDone(_OutputItemEvent):
    type: Literal["response.output_item.done"] = "response.output_item.done"


class _PartEvent(_Event):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ResponseContentPartAdded(_PartEvent):
    """Announces ``part`` before its first delta."""

    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: Part


class ResponseContentPartDone(_PartEvent):
    """The finished ``part`` (with its full transcript / text)."""

    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: Part


class ResponseOutputAudioDelta(_PartEvent):
    """``delta``: base64 audio in the session's output format."""

    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str


class ResponseOutputAudioDone(_PartEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class ResponseOutputAudioTranscriptDelta(_PartEvent):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class ResponseOutputAudioTranscriptDone(_PartEvent):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class ResponseOutputTextDelta(_PartEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class ResponseOutputTextDone(_PartEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class OutputAudioBufferStarted(_Event):
    """The client started hearing ``response_id``'s audio."""

    type: Literal["output_audio_buffer.started"] = "output_audio_buffer.started"
    response_id: str


class OutputAudioBufferStopped(_Event):
    """All of ``response_id``'s audio has been played."""

    type: Literal["output_audio_buffer.stopped"] = "output_audio_buffer.stopped"
    response_id: str


class OutputAudioBufferCleared(_Event):
    """Unplayed audio of ``response_id`` was dropped (``output_audio_buffer.clear`` or barge-in)."""

    type: Literal["output_audio_buffer.cleared"] = "output_audio_buffer.cleared"
    response_id: str


class Error(_Event):
    type: Literal["error"] = "error"
    error: ErrorBody


ServerEvent = Annotated[
    SessionCreated
    | SessionUpdated
    | InputAudioBufferSpeechStarted
    | InputAudioBufferSpeechStopped
    | InputAudioBufferCommitted
    | InputAudioBufferCleared
    | ConversationItemAdded
    | ConversationItemDone
    | ConversationItemDeleted
    | ConversationItemTruncated
    | ConversationItemRetrieved
    | ConversationItemInputAudioTranscriptionCompleted
    | ConversationItemInputAudioTranscriptionDelta
    | ResponseCreated
    | ResponseDone
    | ResponseOutputItemAdded
    | ResponseOutputItemDone
    | ResponseContentPartAdded
    | ResponseContentPartDone
    | ResponseOutputAudioDelta
    | ResponseOutputAudioDone
    | ResponseOutputAudioTranscriptDelta
    | ResponseOutputAudioTranscriptDone
    | ResponseOutputTextDelta
    | ResponseOutputTextDone
    | OutputAudioBufferStarted
    | OutputAudioBufferStopped
    | OutputAudioBufferCleared
    | Union[TOOL_EVENTS]  # noqa: UP007 (a tuple of classes: tool_events.py)
    | Error,
    Field(discriminator="type"),
]
"""Every server event we emit, discriminated on ``type``."""

SERVER_EVENTS: dict[str, type[_Event]] = {
    cls.model_fields["type"].default: cls for cls in get_args(get_args(ServerEvent)[0])
}
"""Server event type → model."""


# -- builders (the server's call sites) --------------------------------------------------------------


def session_created(cfg: SessionConfig) -> SessionCreated:
    return SessionCreated(session=session_object(cfg))


def session_updated(cfg: SessionConfig) -> SessionUpdated:
    return SessionUpdated(session=session_object(cfg))


def input_audio_buffer_speech_started(audio_start_ms: int, item_id: str) -> InputAudioBufferSpeechStarted:
    return InputAudioBufferSpeechStarted(audio_start_ms=int(audio_start_ms), item_id=item_id)


def input_audio_buffer_speech_stopped(audio_end_ms: int, item_id: str) -> InputAudioBufferSpeechStopped:
    return InputAudioBufferSpeechStopped(audio_end_ms=int(audio_end_ms), item_id=item_id)


def input_audio_buffer_committed(
    item_id: str, previous_item_id: str | None = None
) -> InputAudioBufferCommitted:
    return InputAudioBufferCommitted(item_id=item_id, previous_item_id=previous_item_id)


def input_audio_buffer_cleared() -> InputAudioBufferCleared:
    return InputAudioBufferCleared()


def conversation_item_added(item: Item, previous_item_id: str | None = None) -> ConversationItemAdded:
    return ConversationItemAdded(item=item, previous_item_id=previous_item_id)


def conversation_item_done(item: Item, previous_item_id: str | None = None) -> ConversationItemDone:
    return ConversationItemDone(item=item, previous_item_id=previous_item_id)


def conversation_item_deleted(item_id: str) -> ConversationItemDeleted:
    return ConversationItemDeleted(item_id=item_id)


def conversation_item_truncated(
    item_id: str, content_index: int, audio_end_ms: int
) -> ConversationItemTruncated:
    return ConversationItemTruncated(
        item_id=item_id, content_index=content_index, audio_end_ms=int(audio_end_ms)
    )


def conversation_item_retrieved(item: Item) -> ConversationItemRetrieved:
    return ConversationItemRetrieved(item=item)


def conversation_item_input_audio_transcription_completed(
    item_id: str, transcript: str, content_index: int = 0, audio_seconds: float = 0.0
) -> ConversationItemInputAudioTranscriptionCompleted:
    """``audio_seconds``: seconds of audio transcribed (the event's ``usage``)."""
    return ConversationItemInputAudioTranscriptionCompleted(
        item_id=item_id,
        content_index=content_index,
        transcript=transcript,
        usage=DurationUsage(seconds=float(audio_seconds)),
    )


def conversation_item_input_audio_transcription_delta(
    item_id: str, delta: str, content_index: int = 0
) -> ConversationItemInputAudioTranscriptionDelta:
    return ConversationItemInputAudioTranscriptionDelta(
        item_id=item_id, content_index=content_index, delta=delta
    )


def response_created(response: Response) -> ResponseCreated:
    return ResponseCreated(response=response)


def response_done(response: Response) -> ResponseDone:
    return ResponseDone(response=response)


def response_output_item_added(
    response_id: str, item: Item, output_index: int = 0
) -> ResponseOutputItemAdded:
    return ResponseOutputItemAdded(response_id=response_id, item=item, output_index=output_index)


def response_output_item_done(response_id: str, item: Item, output_index: int = 0) -> ResponseOutputItemDone:
    return ResponseOutputItemDone(response_id=response_id, item=item, output_index=output_index)


def _ids(response_id: str, item_id: str, output_index: int, content_index: int) -> dict:
    return {
        "response_id": response_id,
        "item_id": item_id,
        "output_index": output_index,
        "content_index": content_index,
    }


def response_content_part_added(
    response_id: str, item_id: str, part: AudioPart | TextPart, output_index: int = 0, content_index: int = 0
) -> ResponseContentPartAdded:
    return ResponseContentPartAdded(part=part, **_ids(response_id, item_id, output_index, content_index))


def response_content_part_done(
    response_id: str, item_id: str, part: AudioPart | TextPart, output_index: int = 0, content_index: int = 0
) -> ResponseContentPartDone:
    return ResponseContentPartDone(part=part, **_ids(response_id, item_id, output_index, content_index))


def response_output_audio_delta(
    response_id: str, item_id: str, delta: bytes | str, output_index: int = 0, content_index: int = 0
) -> ResponseOutputAudioDelta:
    """One chunk of output audio: raw ``bytes`` (base64-encoded here) or an already base64 ``str``."""
    if isinstance(delta, (bytes, bytearray, memoryview)):
        delta = base64.b64encode(delta).decode("ascii")
    return ResponseOutputAudioDelta(delta=delta, **_ids(response_id, item_id, output_index, content_index))


def response_output_audio_done(
    response_id: str, item_id: str, output_index: int = 0, content_index: int = 0
) -> ResponseOutputAudioDone:
    return ResponseOutputAudioDone(**_ids(response_id, item_id, output_index, content_index))


def response_output_audio_transcript_delta(
    response_id: str, item_id: str, delta: str, output_index: int = 0, content_index: int = 0
) -> ResponseOutputAudioTranscriptDelta:
    return ResponseOutputAudioTranscriptDelta(
        delta=delta, **_ids(response_id, item_id, output_index, content_index)
    )


def response_output_audio_transcript_done(
    response_id: str, item_id: str, transcript: str, output_index: int = 0, content_index: int = 0
) -> ResponseOutputAudioTranscriptDone:
    return ResponseOutputAudioTranscriptDone(
        transcript=transcript, **_ids(response_id, item_id, output_index, content_index)
    )


def response_output_text_delta(
    response_id: str, item_id: str, delta: str, output_index: int = 0, content_index: int = 0
) -> ResponseOutputTextDelta:
    return ResponseOutputTextDelta(delta=delta, **_ids(response_id, item_id, output_index, content_index))


def response_output_text_done(
    response_id: str, item_id: str, text: str, output_index: int = 0, content_index: int = 0
) -> ResponseOutputTextDone:
    return ResponseOutputTextDone(text=text, **_ids(response_id, item_id, output_index, content_index))


def output_audio_buffer_started(response_id: str) -> OutputAudioBufferStarted:
    return OutputAudioBufferStarted(response_id=response_id)


def output_audio_buffer_stopped(response_id: str) -> OutputAudioBufferStopped:
    return OutputAudioBufferStopped(response_id=response_id)


def output_audio_buffer_cleared(response_id: str) -> OutputAudioBufferCleared:
    return OutputAudioBufferCleared(response_id=response_id)


def error(
    message: str,
    *,
    code: str | None = None,
    type: str = "invalid_request_error",  # noqa: A002 (wire name)
    param: str | None = None,
    event_id: str | None = None,
) -> Error:
    """``error {error: {type, code, message, param, event_id}}``; ``event_id`` inside is the client's
    event that caused it (the outer ``event_id`` is this event's own)."""
    return Error(error=ErrorBody(type=type, code=code, message=message, param=param, event_id=event_id))
