"""Client → server events of the OpenAI Realtime API (GA) as pydantic v2 models, and the session config.

Shapes follow the GA API reference (https://platform.openai.com/docs/api-reference/realtime-client-events)
as generated into the ``openai`` SDK (``openai/types/realtime/*_param.py``, SDK 3.54); the tests check
every event the SDK can build against these models. Parse with
:func:`omniduplex.app.surfaces.wire.realtime.protocol.parse_client_event`, which turns validation failures
into ``ProtocolError``.

Leniency: unknown fields are ignored (``extra="ignore"``), as are fields we accept but cannot honour
(``noise_reduction``, ``include``, ``tracing``, ``truncation``, ``prompt``, ``reasoning``,
``parallel_tool_calls``). ``tools`` / ``tool_choice`` are checked where they are applied
(:mod:`omniduplex.app.surfaces.realtime.tools`), so an error names the tool and field. Known fields are
validated strictly (no ``"5"`` → 5, no ``1.0`` → 1), since a silently mis-read field (an audio format, a
modality) breaks a call later and far from its cause. Beta-only fields are rejected before these models
see them (``protocol.py``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


# -- audio formats -----------------------------------------------------------------------------------
class PcmFormat(_Model):
    """``audio/pcm``: 16-bit signed little-endian mono PCM at 24000 Hz (the only rate the API allows)."""

    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class PcmuFormat(_Model):
    """``audio/pcmu``: G.711 μ-law, 8000 Hz, one byte per sample."""

    type: Literal["audio/pcmu"] = "audio/pcmu"


class PcmaFormat(_Model):
    """``audio/pcma``: G.711 A-law, 8000 Hz, one byte per sample."""

    type: Literal["audio/pcma"] = "audio/pcma"


def _format_tag(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("type", "audio/pcm")  # the SDK marks ``type`` optional; PCM is the default format
    return getattr(v, "type", None)


AudioFormat = Annotated[
    Annotated[PcmFormat, Tag("audio/pcm")]
    | Annotated[PcmuFormat, Tag("audio/pcmu")]
    | Annotated[PcmaFormat, Tag("audio/pcma")],
    Discriminator(_format_tag),
]
"""One of the three GA audio formats, discriminated on ``type``."""


# -- turn detection, transcription ------------------------------------------------------------------
class ServerVad(_Model):
    """Energy/VAD-based turn detection. Defaults are the API's (threshold 0.5, 300 ms, 500 ms)."""

    type: Literal["server_vad"]
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0)
    silence_duration_ms: int = Field(500, ge=0)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = Field(None, ge=0)


class SemanticVad(_Model):
    """Model-based end-of-turn detection; ``eagerness`` ``auto`` = ``medium`` (max wait 8/4/2 s)."""

    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


TurnDetection = Annotated[ServerVad | SemanticVad, Field(discriminator="type")]


class Transcription(_Model):
    """Input audio transcription settings: ASR model name, ISO-639-1 ``language``, biasing ``prompt``."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class NoiseReduction(_Model):
    """Accepted and echoed; omniduplex applies no noise reduction."""

    type: Literal["near_field", "far_field"] | None = None
    strength: float | None = None


def _voice_id(v: Any) -> Any:
    """A custom voice ``{"id": "voice_…"}`` is kept as its id string."""
    if isinstance(v, dict):
        if not isinstance(v.get("id"), str):
            raise PydanticCustomError("invalid_value", "a custom voice object needs a string 'id'")
        return v["id"]
    return v


Voice = Annotated[str, Field(min_length=1)]


def _one_modality(v: list[str]) -> list[str]:
    if len(v) != 1:
        raise PydanticCustomError("invalid_value", 'output_modalities must be ["audio"] or ["text"]')
    return v


Modalities = list[Literal["audio", "text"]]
MaxTokens = Annotated[int, Field(ge=1)] | Literal["inf"]


# -- session -----------------------------------------------------------------------------------------
class AudioInput(_Model):
    format: AudioFormat = Field(default_factory=PcmFormat)
    transcription: Transcription | None = None
    noise_reduction: NoiseReduction | None = None
    turn_detection: TurnDetection | None = Field(default_factory=lambda: ServerVad(type="server_vad"))


class AudioOutput(_Model):
    format: AudioFormat = Field(default_factory=PcmFormat)
    voice: Voice = "alloy"
    speed: float = Field(1.0, ge=0.25, le=1.5)

    @field_validator("voice", mode="before")
    @classmethod
    def voice_id(cls, v: Any) -> Any:
        return _voice_id(v)


class SessionAudio(_Model):
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class SessionConfig(_Model):
    """The effective realtime session configuration (what ``session.created|updated`` report).

    Also the shape of ``session.update``'s ``session`` (:class:`SessionUpdateParams`), where only the
    fields the client sent count (``model_fields_set``); merge with :func:`apply_session_update`.
    ``id`` and ``model`` are the server's; ``tools``/``tool_choice``: the function tools every response is
    offered (a response may override them).
    """

    type: Literal["realtime"] = "realtime"
    id: str = ""
    model: str = "omniduplex"
    instructions: str = ""
    output_modalities: Annotated[Modalities, Field(min_length=1)] = Field(default_factory=lambda: ["audio"])
    audio: SessionAudio = Field(default_factory=SessionAudio)
    max_output_tokens: MaxTokens = "inf"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"

    @field_validator("output_modalities")
    @classmethod
    def one_modality(cls, v: list[str]) -> list[str]:
        return _one_modality(v)


class SessionUpdateParams(SessionConfig):
    """``session.update``'s ``session``: like :class:`SessionConfig` but ``type`` is required (GA)."""

    type: Literal["realtime"]


_MERGED_PATHS = {("audio",), ("audio", "input"), ("audio", "output"), ("audio", "input", "noise_reduction")}
_SERVER_OWNED = {"id", "model"}


def _merge(base: dict, patch: dict, path: tuple[str, ...] = ()) -> dict:
    out = dict(base)
    for k, v in patch.items():
        p = (*path, k)
        if p in _MERGED_PATHS and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, p)
        else:
            out[k] = v
    return out


def apply_session_update(current: SessionConfig, update: SessionUpdateParams) -> SessionConfig:
    """The config after ``session.update``: only fields the client sent change; ``null`` clears.

    ``audio``, ``audio.input``, ``audio.output`` and ``noise_reduction`` merge field by field; every
    other field (``format``, ``turn_detection``, ``transcription``, ``tools``, …) is replaced whole,
    with the API's defaults for its unsent subfields. ``id`` and ``model`` are kept (server-owned).
    """
    patch = update.model_dump(exclude_unset=True, exclude=_SERVER_OWNED)
    return SessionConfig.model_validate(_merge(current.model_dump(), patch))


# -- conversation items ------------------------------------------------------------------------------
def _check_base64(v: str | None) -> str | None:
    if v is not None:
        try:
            base64.b64decode("".join(v.split()), validate=True)
        except (binascii.Error, ValueError) as e:
            raise PydanticCustomError(
                "invalid_audio", "audio is not valid base64: {reason}", {"reason": str(e)}
            ) from None
    return v


Base64Audio = Annotated[str, Field(description="base64 audio bytes in the session's input format")]


class _TextContent(_Model):
    type: str
    text: str


class _AudioContent(_Model):
    """Audio, base64 in the session's format, and/or its transcript."""

    type: str
    audio: Base64Audio | None = None
    transcript: str | None = None

    @field_validator("audio")
    @classmethod
    def base64_audio(cls, v: str | None) -> str | None:
        return _check_base64(v)


class InputText(_TextContent):
    type: Literal["input_text"]


class InputAudio(_AudioContent):
    """User audio, base64 in the session's input format, and/or its transcript."""

    type: Literal["input_audio"]


class OutputText(_TextContent):
    type: Literal["output_text"]


class OutputAudio(_AudioContent):
    type: Literal["output_audio"]


class _Message(_Model):
    type: Literal["message"]
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class SystemMessage(_Message):
    role: Literal["system"]
    content: list[InputText]


class UserMessage(_Message):
    role: Literal["user"]
    content: list[Annotated[InputText | InputAudio, Field(discriminator="type")]]


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: list[Annotated[OutputText | OutputAudio, Field(discriminator="type")]]


class FunctionCall(_Model):
    """A ``function_call`` item a client adds (a call made elsewhere, replayed into the conversation)."""

    type: Literal["function_call"]
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutput(_Model):
    """A ``function_call_output`` item: the client's result (``output``, any string) of call ``call_id``."""

    type: Literal["function_call_output"]
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    call_id: str = Field(min_length=1)
    output: str


class ItemReference(_Model):
    """``{"type": "item_reference", "id": …}``: an existing conversation item, in ``response.input``."""

    type: Literal["item_reference"]
    id: str


_UNSUPPORTED_ITEM = (
    "unsupported item: only type 'message' with role 'user', 'assistant' or 'system', 'function_call' and"
    " 'function_call_output' (and 'item_reference' in response.input) are supported"
)
_TOOL_ITEMS = ("item_reference", "function_call", "function_call_output")


def _item_tag(v: Any) -> str | None:
    if isinstance(v, dict):
        kind, role = v.get("type"), v.get("role")
    else:
        kind, role = getattr(v, "type", None), getattr(v, "role", None)
    if kind in _TOOL_ITEMS:
        return kind
    return role if kind == "message" and role in ("user", "assistant", "system") else None


MessageItem = Annotated[
    Annotated[SystemMessage, Tag("system")]
    | Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")],
    Discriminator(_item_tag, custom_error_type="invalid_value", custom_error_message=_UNSUPPORTED_ITEM),
]
"""An item of ``conversation.item.create``: a message (discriminated on ``role``) or a tool item."""

ResponseInputItem = Annotated[
    Annotated[SystemMessage, Tag("system")]
    | Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[ItemReference, Tag("item_reference")],
    Discriminator(_item_tag, custom_error_type="invalid_value", custom_error_message=_UNSUPPORTED_ITEM),
]


# -- response parameters -----------------------------------------------------------------------------
class ResponseAudioOutput(_Model):
    format: AudioFormat | None = None
    voice: Voice | None = None

    @field_validator("voice", mode="before")
    @classmethod
    def voice_id(cls, v: Any) -> Any:
        return _voice_id(v)


class ResponseAudio(_Model):
    output: ResponseAudioOutput = Field(default_factory=ResponseAudioOutput)


def _check_metadata(v: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI metadata limits: ≤ 16 pairs, keys ≤ 64 characters, values ≤ 512 characters."""
    if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items())):
        raise PydanticCustomError(
            "invalid_value", "metadata: at most 16 pairs, keys ≤ 64, values ≤ 512 chars"
        )
    return v


class ResponseParams(_Model):
    """``response.create``'s ``response``; unset fields fall back to the session config.

    ``conversation``: ``auto`` (the reply joins the conversation) or ``none`` (out-of-band: the reply
    is not added to it; with ``input`` it sees only those items). ``metadata`` is echoed in
    ``response.created|done``.
    """

    instructions: str | None = None
    output_modalities: Annotated[Modalities, Field(min_length=1)] | None = None
    metadata: dict[str, str] | None = None
    max_output_tokens: MaxTokens | None = None
    conversation: Literal["auto", "none"] = "auto"
    input: list[ResponseInputItem] | None = None
    audio: ResponseAudio | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    @field_validator("output_modalities")
    @classmethod
    def one_modality(cls, v: list[str] | None) -> list[str] | None:
        return v if v is None else _one_modality(v)

    @field_validator("metadata")
    @classmethod
    def metadata_limits(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return _check_metadata(v)


# -- events ------------------------------------------------------------------------------------------
class _Event(_Model):
    event_id: str | None = None
    """The client's id for this event; echoed in an ``error`` it causes."""


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionUpdateParams


class InputAudioBufferAppend(_Event):
    """``audio``: base64 bytes in the session's input format (decode with ``audio.InputConverter``)."""

    type: Literal["input_audio_buffer.append"]
    audio: Base64Audio

    @field_validator("audio")
    @classmethod
    def base64_audio(cls, v: str | None) -> str | None:
        return _check_base64(v)


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(_Event):
    """Add ``item`` after ``previous_item_id`` (``None``: at the end; ``"root"``: at the start)."""

    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: MessageItem


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ConversationItemTruncate(_Event):
    """Cut assistant audio ``item_id`` at ``audio_end_ms`` (ms of played audio) of ``content_index``."""

    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseParams = Field(default_factory=ResponseParams)


class ResponseCancel(_Event):
    """Cancel ``response_id`` (``None``: the response in progress)."""

    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioBufferClear(_Event):
    type: Literal["output_audio_buffer.clear"]


ClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemDelete
    | ConversationItemTruncate
    | ConversationItemRetrieve
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear,
    Field(discriminator="type"),
]
"""Every client event we accept, discriminated on ``type``."""

CLIENT_EVENTS: dict[str, type[_Event]] = {
    get_args(cls.model_fields["type"].annotation)[0]: cls for cls in get_args(get_args(ClientEvent)[0])
}
"""Client event type → model."""
