"""Typed meta of the messages on each stage edge: one small model per message kind.

On the wire a :class:`~.messages.StageMessage` keeps its ``meta`` dict (JSON between stage processes) with
the key names below; these models say which keys each kind has and their types. The meta of every kind is
its own fields plus the turn's options (:class:`TurnOptions`: what the session sent with the turn, passed down
the chain with each stage's first message of the turn). :func:`parse` reads a message as the kind its
producer sends and always validates the types of every key named here (a message missing a required one is
rejected): the same typed objects in production and in the tests. Keys not named anywhere pass as the
session's own turn options.

Which kind travels where (:data:`OUTPUT_KINDS`): the orchestrator sends :class:`TurnRequest` (a turn's
audio), :class:`AsrPiece` (audio of a turn still being spoken) or :class:`SpeechRequest` (text to speak);
the ASR sends :class:`Transcript` / :class:`PartialTranscript`; encoders :class:`Encoded`; the decoder stages
(Thinker, Talker, unified LM, cascade LLM, Qwen3-TTS talker) :class:`DecoderOutput`, with the tool-call
events of :mod:`.stages.tool_calls`; the audio stages :class:`AudioOutput`; a failed stage
:class:`StageError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omniduplex.pipeline.messages import StageMessage, is_partial_transcript


class EdgeMessageError(ValueError):
    """A message's meta does not fit its kind (the stage and the offending keys named)."""


class TurnOptions(BaseModel):
    """The turn's options from the session (:meth:`~.orchestrator.Orchestrator.submit`), passed down.

    ``history``: ``[role, text]`` pairs and Realtime items (``function_call`` / ``function_call_output``
    dicts); ``sampling`` / ``talker_sampling``: :class:`~.engine.request.SamplingParams` fields; ``tools`` /
    ``tool_choice``: OpenAI function tools (:mod:`omniduplex.models.cascade.tool_prompt`). Keys not named
    here travel untouched (the session's own)."""

    model_config = ConfigDict(extra="allow")

    system_prompt: str | None = None
    history: list[list | dict] | None = None
    sampling: dict[str, Any] | None = None
    talker_sampling: dict[str, Any] | None = None
    speaker: str | None = None
    voice: str | None = None
    user_text: str | None = None
    max_text_tokens: int | None = None
    max_audio_frames: int | None = None
    cfg_scale: float | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    spoken: bool | None = None


class _Kind(BaseModel):
    """A message kind: its own keys (``extra`` forbidden); the rest of the meta is the turn's options."""

    model_config = ConfigDict(extra="forbid")

    turn: TurnOptions = Field(default_factory=TurnOptions)

    def to_meta(self) -> dict[str, Any]:
        """The wire meta: the turn's options and the kind's own keys, ``None`` fields left out."""
        own = self.model_dump(exclude_none=True, exclude={"turn"})
        return {**self.turn.model_dump(exclude_none=True), **own}


class TurnRequest(_Kind):
    """Orchestrator → entry stage: a turn (tensor ``waveform`` float32 ``[samples]`` at 16 kHz; empty for a
    typed turn, whose words are ``turn.user_text``). Own keys: none."""


class Prefill(BaseModel):
    """The conversation a turn still being spoken will be answered in (its tools too: they are rendered into
    the prompt's system part, so a hint without them would share almost nothing with the turn)."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str
    history: list[list | dict]
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None


class AsrPiece(_Kind):
    """Orchestrator → ASR: the next samples of a turn still being spoken (``last=False``)."""

    asr_piece: Literal[True]
    prefill: Prefill | None = None


class SpeechRequest(_Kind):
    """Orchestrator → Qwen3-TTS talker: text to speak; ``voice``, ``instructions``, ``language``,
    ``ref_text``, ``sampling`` (tensor ``ref_audio``: 24 kHz float32 for a cloned voice)."""

    text: str
    instructions: str | None = None
    language: str | None = None
    ref_text: str | None = None


class Transcript(_Kind):
    """ASR → LLM and orchestrator: what the user said; ``words``: ``[word, start_s, end_s]``; ``asr_ms``:
    the decode's compute (ms); ``asr_tail_s``: audio left to decode at end of a turn fed while spoken (s)."""

    transcript: str = ""
    words: list[list] = []
    asr_ms: float | None = None
    asr_tail_s: float | None = None


class PartialTranscript(_Kind):
    """ASR → orchestrator (captions) and, with ``prefill``, the LLM (a prefill hint): ``last=False``."""

    partial_transcript: str
    stable_transcript: str = ""
    prefill: Prefill | None = None


class Encoded(_Kind):
    """Encoder / codec encoder → decoder: the prompt in tensors (``prompt_ids`` + ``audio_embeds``, or
    ``prompt_steps``). Own keys: none."""


class ToolCallStarted(BaseModel):
    call_id: str
    name: str
    index: int


class ToolCallArgumentsDelta(BaseModel):
    call_id: str
    delta: str


class ToolCallDone(BaseModel):
    call_id: str
    name: str
    arguments: str


class ToolCallFailed(BaseModel):
    call_id: str
    name: str
    error: str


class DecoderOutput(_Kind):
    """A decoder stage's step of one request (tensor ``token`` or ``codes``): ``text`` the reply text it adds
    (cascade LLM), the tool-call events (:mod:`.stages.tool_calls`), on the last ``finish_reason`` and
    ``unspoken`` (text a token budget cut), ``skipped`` (a turn answered without the engine), ``talker_ms``
    (Qwen3-TTS talker: admission → first frame, ms)."""

    text: str | None = None
    finish_reason: str | None = None
    unspoken: str | None = None
    skipped: str | None = None
    talker_ms: float | None = None
    tool_call_started: ToolCallStarted | None = None
    tool_call_arguments_delta: ToolCallArgumentsDelta | None = None
    tool_call_done: ToolCallDone | None = None
    tool_call_failed: ToolCallFailed | None = None


class AudioOutput(_Kind):
    """An audio stage's piece (tensor ``pcm`` float32): ``text`` the words it speaks (cascade TTS),
    ``chunk`` its index, ``tts_ms`` its synthesis time, ``talker_ms`` / ``codec_ms`` the Qwen3-TTS graph's
    TTFP split (ms), ``skipped`` passed on from the LLM."""

    text: str | None = None
    chunk: int | None = None
    tts_ms: float | None = None
    talker_ms: float | None = None
    codec_ms: float | None = None
    skipped: str | None = None


class StageError(_Kind):
    """A stage (or the backend) failed the request: ``error`` says why; the turn is over."""

    error: str = "stage failure"


EdgeMessage = (
    TurnRequest
    | AsrPiece
    | SpeechRequest
    | Transcript
    | PartialTranscript
    | Encoded
    | DecoderOutput
    | AudioOutput
    | StageError
)

OUTPUT_KINDS: dict[str, type[_Kind]] = {
    "encoder": Encoded,
    "codec_encoder": Encoded,
    "thinker": DecoderOutput,
    "talker": DecoderOutput,
    "unified": DecoderOutput,
    "llm": DecoderOutput,
    "tts_talker": DecoderOutput,
    "code2wav": AudioOutput,
    "codec": AudioOutput,
    "tts": AudioOutput,
    "tts_codec": AudioOutput,
    "asr": Transcript,
}
"""Stage kind → the kind of its output messages (the ASR's partials: :class:`PartialTranscript`)."""


def input_kind(msg: StageMessage) -> type[_Kind]:
    """The kind of a message the orchestrator sends to the graph's entry."""
    if "asr_piece" in msg.meta:
        return AsrPiece
    return SpeechRequest if "text" in msg.meta else TurnRequest


def output_kind(stage: str, msg: StageMessage) -> type[_Kind]:
    """The kind of an output message of ``stage`` (``"orchestrator"``: one the orchestrator sends)."""
    if stage == "orchestrator":
        return input_kind(msg)
    if stage == "asr" and is_partial_transcript(msg):
        return PartialTranscript
    return OUTPUT_KINDS[stage]


def parse(kind: type[_Kind], msg: StageMessage) -> Any:
    """``msg``'s meta as ``kind``: its own keys as fields, the rest as :class:`TurnOptions`; always validated.

    Raises:
        EdgeMessageError: a key of the wrong type (or a required one missing).
    """
    own = {k: v for k, v in msg.meta.items() if k in kind.model_fields}
    rest = {k: v for k, v in msg.meta.items() if k not in kind.model_fields}
    try:
        return kind(turn=TurnOptions(**rest), **own)
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise EdgeMessageError(f"request {msg.request_id}: {kind.__name__} meta: {where}") from None


def check_message(stage: str, msg: StageMessage) -> None:
    """Validate an output message of ``stage`` against its kind (:func:`output_kind`).

    Raises:
        EdgeMessageError: its meta does not fit (names the stage, the kind and the keys)."""
    try:
        parse(output_kind(stage, msg), msg)
    except EdgeMessageError as e:
        raise EdgeMessageError(f"{stage}: {e}") from None


def checked(stage: str, outs: list[StageMessage], fail: Callable[[str, str], None]) -> list[StageMessage]:
    """The output messages of one step of ``stage`` to send on: those whose meta fits their kind, the request
    of any other failed through ``fail(rid, error)``."""
    ok = []
    for msg in outs:
        try:
            check_message(stage, msg)
        except EdgeMessageError as e:
            fail(msg.request_id, str(e))
            continue
        ok.append(msg)
    return ok
