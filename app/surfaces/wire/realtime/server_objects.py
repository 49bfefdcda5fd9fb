"""The objects inside Realtime API (GA) server events, as pydantic v2 models, and their builders: conversation
items and their content, response content parts, the response object with its usage and status details, the
session object, the error body.

Shapes and names follow the GA API reference (https://platform.openai.com/docs/api-reference/realtime-server-events)
as generated into the ``openai`` SDK 3.57 (``RealtimeConversationItem*``, ``RealtimeResponse``,
``RealtimeResponseUsage``, ``RealtimeResponseStatus``, ``RealtimeSessionCreateResponse``, ``RealtimeError``);
tests/test_realtime_protocol.py validates them with the SDK. The events that carry them are in
:mod:`.server_events`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from omniduplex.app.surfaces.wire.realtime.client_events import (
    AssistantMessage,
    AudioFormat,
    SessionConfig,
    SystemMessage,
    UserMessage,
)

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
Role = Literal["user", "assistant", "system"]


class WireModel(BaseModel):
    """Base of every server-side model: unknown fields are ignored when parsing (a newer server's extras)."""

    model_config = ConfigDict(extra="ignore")


# -- objects -----------------------------------------------------------------------------------------
class SessionObject(SessionConfig):
    """The GA session object as ``session.created|updated`` report it: the effective config."""

    object: Literal["realtime.session"] = "realtime.session"


class _TextContent(WireModel):
    type: str
    text: str


class _TranscriptContent(WireModel):
    type: str
    transcript: str | None = None


class InputTextContent(_TextContent):
    type: Literal["input_text"] = "input_text"


class InputAudioContent(_TranscriptContent):
    """User audio as items report it: the transcript only (``None`` until transcription completes)."""

    type: Literal["input_audio"] = "input_audio"


class OutputTextContent(_TextContent):
    type: Literal["output_text"] = "output_text"


class OutputAudioContent(_TranscriptContent):
    """Assistant audio as items report it (the audio itself went out as deltas)."""

    type: Literal["output_audio"] = "output_audio"


ItemContent = Annotated[
    InputTextContent | InputAudioContent | OutputTextContent | OutputAudioContent, Field(discriminator="type")
]


class _RealtimeItem(WireModel):
    """The fields every ``realtime.item`` starts with (``type`` narrowed by each kind)."""

    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: str
    status: ItemStatus = "completed"


class Item(_RealtimeItem):
    """A conversation item ``{id, object: realtime.item, type: message, status, role, content}``."""

    type: Literal["message"] = "message"
    role: Role
    content: list[ItemContent] = Field(default_factory=list)

    @property
    def text(self) -> str:
        """The parts' text or transcripts, joined by spaces."""
        parts = (getattr(c, "text", None) or getattr(c, "transcript", None) for c in self.content)
        return " ".join(p for p in parts if p).strip()


class FunctionCallItem(_RealtimeItem):
    """A ``function_call`` item: the model called function ``name`` (``arguments``: a JSON object as a string,
    "" while it streams); ``call_id`` names the call for its ``function_call_output``."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = ""


class FunctionCallOutputItem(_RealtimeItem):
    """A ``function_call_output`` item: the result (``output``, any string) of call ``call_id``."""

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


class McpListToolsItem(WireModel):
    """An ``mcp_list_tools`` item: the tools MCP server ``server_label`` offers (``{name, description,
    input_schema}`` each)."""

    id: str
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    server_label: str
    tools: list[dict] = Field(default_factory=list)


class McpCallItem(WireModel):
    """An ``mcp_call`` item: the server called tool ``name`` of MCP server ``server_label`` itself;
    ``output`` its result, or ``error`` (``{"type": "tool_execution_error", "message"}``) when it failed."""

    id: str
    type: Literal["mcp_call"] = "mcp_call"
    server_label: str
    name: str
    arguments: str = ""
    output: str | None = None
    error: dict | None = None


AnyItem = Annotated[
    Item | FunctionCallItem | FunctionCallOutputItem | McpListToolsItem | McpCallItem,
    Field(discriminator="type"),
]
"""Any conversation item we report."""


class AudioPart(WireModel):
    """The ``part`` of ``response.content_part.added|done`` for audio (``audio``, not ``output_audio``)."""

    type: Literal["audio"] = "audio"
    transcript: str = ""


class TextPart(WireModel):
    type: Literal["text"] = "text"
    text: str = ""


Part = Annotated[AudioPart | TextPart, Field(discriminator="type")]


class InputTokenDetails(WireModel):
    text_tokens: int = 0
    audio_tokens: int = 0
    cached_tokens: int = 0


class OutputTokenDetails(WireModel):
    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(WireModel):
    """``response.usage`` (token counts; totals are the sums)."""

    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails = Field(default_factory=InputTokenDetails)
    output_token_details: OutputTokenDetails = Field(default_factory=OutputTokenDetails)


class StatusError(WireModel):
    type: str
    code: str | None = None
    message: str | None = None


class StatusDetails(WireModel):
    """``response.status_details``: ``cancelled`` by ``turn_detected`` (barge-in) or ``client_cancelled``;
    ``incomplete`` by ``max_output_tokens``; ``failed`` with ``error {type, code, message}``."""

    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: StatusError | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None or k == "type"}


class ResponseAudioOutput(WireModel):
    format: AudioFormat | None = None
    voice: str | None = None


class ResponseAudio(WireModel):
    output: ResponseAudioOutput = Field(default_factory=ResponseAudioOutput)


class Response(WireModel):
    """The GA response object. ``conversation_id``: ``None`` for an out-of-band response; ``metadata`` as
    the client sent it in ``response.create``."""

    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: ResponseStatus = "in_progress"
    status_details: StatusDetails | None = None
    output: list[AnyItem] = Field(default_factory=list)
    conversation_id: str | None = None
    output_modalities: list[Literal["audio", "text"]] = Field(default_factory=lambda: ["audio"])
    max_output_tokens: int | Literal["inf"] = "inf"
    audio: ResponseAudio = Field(default_factory=ResponseAudio)
    usage: Usage | None = None
    metadata: dict[str, str] | None = None


class ErrorBody(WireModel):
    """``event_id``: the client's event that caused the error (``None`` when unknown)."""

    type: str = "invalid_request_error"
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None


class DurationUsage(WireModel):
    """Transcription usage: ``seconds`` of audio transcribed."""

    type: Literal["duration"] = "duration"
    seconds: float = 0.0


def session_object(cfg: SessionConfig) -> SessionObject:
    """The GA session object for ``cfg``, as ``session.*`` report it."""
    return SessionObject.model_validate(cfg.model_dump())


def message_item(item_id: str, role: Role, content: list, status: ItemStatus = "completed") -> Item:
    """A conversation item of ``content`` parts (:func:`input_text`, :func:`output_audio`, …)."""
    return Item(id=item_id, role=role, content=list(content), status=status)


def client_item(item: UserMessage | AssistantMessage | SystemMessage, item_id: str) -> Item:
    """A client-created item (``conversation.item.create``) as the server reports it: our ``item_id``,
    ``status: completed``, audio bytes dropped from its content (the API echoes only transcripts)."""
    content = [c.model_dump(exclude={"audio"}) for c in item.content]
    return Item.model_validate({"id": item_id, "role": item.role, "content": content})


def input_text(text: str) -> InputTextContent:
    return InputTextContent(text=text)


def input_audio(transcript: str | None = None) -> InputAudioContent:
    """User audio content; ``transcript`` stays ``None`` until transcription completes."""
    return InputAudioContent(transcript=transcript)


def output_text(text: str) -> OutputTextContent:
    return OutputTextContent(text=text)


def output_audio(transcript: str) -> OutputAudioContent:
    return OutputAudioContent(transcript=transcript)


def audio_part(transcript: str = "") -> AudioPart:
    return AudioPart(transcript=transcript)


def text_part(text: str = "") -> TextPart:
    return TextPart(text=text)


def usage_object(
    *,
    input_text_tokens: int = 0,
    input_audio_tokens: int = 0,
    output_text_tokens: int = 0,
    output_audio_tokens: int = 0,
    cached_tokens: int = 0,
) -> Usage:
    """``response.usage`` from token counts (totals are the sums)."""
    i, o = input_text_tokens + input_audio_tokens, output_text_tokens + output_audio_tokens
    return Usage(
        total_tokens=i + o,
        input_tokens=i,
        output_tokens=o,
        input_token_details=InputTokenDetails(
            text_tokens=input_text_tokens, audio_tokens=input_audio_tokens, cached_tokens=cached_tokens
        ),
        output_token_details=OutputTokenDetails(
            text_tokens=output_text_tokens, audio_tokens=output_audio_tokens
        ),
    )


def status_details(type_: str, reason: str | None = None, error: dict | None = None) -> StatusDetails:
    """See :class:`StatusDetails`."""
    return StatusDetails(type=type_, reason=reason, error=error)


def response_object(
    response_id: str,
    *,
    status: ResponseStatus = "in_progress",
    output: list[Item] | tuple = (),
    conversation_id: str | None = None,
    output_modalities: list[str] | tuple = ("audio",),
    metadata: dict[str, str] | None = None,
    usage: Usage | None = None,
    status_details: StatusDetails | None = None,
    voice: str | None = None,
    output_format: dict | None = None,
    max_output_tokens: int | str = "inf",
) -> Response:
    """The response object; ``output_format``: e.g. ``{"type": "audio/pcm", "rate": 24000}``."""
    return Response(
        id=response_id,
        status=status,
        status_details=status_details,
        output=list(output),
        conversation_id=conversation_id,
        output_modalities=list(output_modalities),
        max_output_tokens=max_output_tokens,
        audio=ResponseAudio(output=ResponseAudioOutput(format=output_format, voice=voice)),
        usage=usage,
        metadata=dict(metadata) if metadata is not None else None,
    )
