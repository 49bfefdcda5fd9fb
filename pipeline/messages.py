"""The messages on the stage edges: :class:`StageMessage` and its typed meta, one model per message kind.

A :class:`StageMessage` is what travels on an edge: a request id, a few named tensors, its meta — always an
instance of one of the kinds below, never a dict — and a ``last`` flag closing that request's stream on the
edge. Each kind is declared once here with its fields (pydantic, ``extra`` forbidden): the producer builds
it (pydantic validates it then), a stage reads it as attributes, and between stage processes it travels as
JSON tagged with its kind's name (:func:`meta_to_wire` / :func:`meta_from_wire`, validated again on
arrival). The same typed objects run in one process and across processes, in production and in the tests.

The turn's options (:class:`TurnOptions`: what the session sent with the turn) ride in ``turn`` on the
first message of a turn on each edge, passed down the chain by each stage.

Which kind travels where (a stage kind's output: :data:`~.stages.kinds.STAGE_KINDS`): the orchestrator
sends :class:`TurnRequest` (a turn's audio), :class:`AsrPiece` (audio of a turn still being spoken) or
:class:`UtteranceRequest` (text to speak); the ASR sends :class:`Transcript` / :class:`PartialTranscript`;
encoders :class:`Encoded`; the decoder stages (Thinker, Talker, unified LM, cascade LLM, Qwen3-TTS talker)
:class:`DecoderOutput`, with a reply's tool-call events (:data:`~.events.CallEvent`: the one shape a call
keeps from the LLM stage to the session); the audio stages :class:`AudioOutput`; a failed stage (or the
backend) :class:`StageError`. What a turn's consumer (CLI, session) sees: :mod:`.events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from omniduplex.pipeline.events import CallArgumentsDelta, CallDone, CallEvent, CallFailed, CallStarted


class EdgeMessageError(ValueError):
    """A message's meta does not fit its kind (the kind and the offending fields named)."""


class TurnOptions(BaseModel):
    """The turn's options from the session (:meth:`~.orchestrator.Orchestrator.submit`), passed down.

    ``history``: ``[role, text]`` pairs and Realtime items (``function_call`` / ``function_call_output``
    dicts); ``sampling`` / ``talker_sampling``: :class:`~.engine.request.SamplingParams` fields; ``tools`` /
    ``tool_choice``: OpenAI function tools (:mod:`omniduplex.models.cascade.tool_prompt`); ``spoken``:
    ``False`` for a text-only reply (chat completions); ``say``: words said as written instead of a
    generated reply (a tool call's filler or apology); ``call_filler``: words a spoken reply says as soon as
    it opens a call of one of ``call_filler_tools`` (the session's server-run tools), while the call is
    written and run; ``user_text``: a typed turn's words; ``speaker`` / ``voice``: the voice;
    ``max_text_tokens``, ``max_audio_frames``, ``cfg_scale``: the unified LM's."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    system_prompt: str | None = None
    history: list[list[Any] | dict[str, Any]] | None = None
    sampling: dict[str, Any] | None = None
    talker_sampling: dict[str, Any] | None = None
    speaker: str | None = None
    voice: str | None = None
    user_text: str | None = None
    max_text_tokens: int | None = None
    max_audio_frames: int | None = None
    cfg_scale: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    spoken: bool | None = None
    say: str | None = None
    call_filler: str | None = None
    call_filler_tools: list[str] | None = None


class Meta(BaseModel):
    """A message kind: its own fields (``extra`` forbidden; assignments validated too) and the turn's options
    in ``turn`` (set on the first message of a turn on each edge, else ``None``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    turn: TurnOptions | None = None

    @property
    def options(self) -> TurnOptions:
        """``turn``, or empty options when this message carries none."""
        return self.turn if self.turn is not None else _NO_OPTIONS


_NO_OPTIONS = TurnOptions()


class TurnRequest(Meta):
    """Orchestrator → entry stage: a turn (tensor ``waveform`` float32 ``[samples]`` at 16 kHz; empty for a
    typed turn, whose words are ``turn.user_text``). Own fields: none."""


class Prefill(BaseModel):
    """The conversation a turn still being spoken will be answered in (its tools too: they are rendered into
    the prompt's system part, so a hint without them would share almost nothing with the turn)."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str
    history: list[list[Any] | dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class AsrPiece(Meta):
    """Orchestrator → ASR: the next samples of a turn still being spoken (``last=False``; tensor
    ``waveform`` float32 at 16 kHz); ``prefill``, with the turn's first piece: its conversation."""

    prefill: Prefill | None = None


class UtteranceRequest(Meta):
    """Orchestrator → Qwen3-TTS talker: ``text`` to speak; ``instructions``, ``language``, ``ref_text`` (and
    ``turn.voice``, ``turn.sampling``); tensor ``ref_audio``: 24 kHz float32 for a cloned voice."""

    text: str
    instructions: str | None = None
    language: str | None = None
    ref_text: str | None = None


class Transcript(Meta):
    """ASR → LLM and orchestrator: what the user said; ``words``: ``[word, start_s, end_s]``; ``asr_ms``:
    the decode's compute (ms); ``asr_tail_s``: audio left to decode at end of a turn fed while spoken (s)."""

    transcript: str = ""
    words: list[list[Any]] = []
    asr_ms: float | None = None
    asr_tail_s: float | None = None


class PartialTranscript(Meta):
    """ASR → orchestrator (captions) and, with ``prefill``, the LLM (a prefill hint): ``last=False``.
    ``partial_transcript``: all heard so far; ``stable_transcript``: the prefix that will not change."""

    partial_transcript: str
    stable_transcript: str = ""
    prefill: Prefill | None = None


class Encoded(Meta):
    """Encoder / codec encoder → decoder: the prompt in tensors (``prompt_ids`` + ``audio_embeds``, or
    ``prompt_steps``). Own fields: none."""


class DecoderOutput(Meta):
    """A decoder stage's step of one request (tensor ``token`` or ``codes``): ``text`` the reply text it adds
    (cascade LLM), a tool-call event (``call_started`` / ``call_delta`` / ``call_done`` / ``call_failed``:
    :data:`~.events.CallEvent`, at most one of each, before the text), on the last ``finish_reason`` and
    ``unspoken`` (text a token budget cut), ``skipped`` (a turn answered without the engine), ``talker_ms``
    (Qwen3-TTS talker: admission → first frame, ms)."""

    text: str | None = None
    finish_reason: str | None = None
    unspoken: str | None = None
    skipped: str | None = None
    talker_ms: float | None = None
    call_started: CallStarted | None = None
    call_delta: CallArgumentsDelta | None = None
    call_done: CallDone | None = None
    call_failed: CallFailed | None = None

    @property
    def calls(self) -> list[CallEvent]:
        """This message's call events, in the order a call's events come."""
        evs = (self.call_started, self.call_delta, self.call_done, self.call_failed)
        return [e for e in evs if e is not None]


class AudioOutput(Meta):
    """An audio stage's piece (tensor ``pcm`` float32): ``text`` the words it speaks (cascade TTS),
    ``chunk`` its index, ``tts_ms`` its synthesis time, ``talker_ms`` / ``codec_ms`` the Qwen3-TTS and
    Qwen3-Omni graphs' TTFP split (ms), ``codec_wait_ms`` (Qwen3-Omni: the first frame's wait at the Code2Wav
    stage for its first chunk to fill and be decoded, ms), ``tts_wait_ms`` (cascade TTS, a clause's first
    piece: the clause's wait in the stage for its turn, from its last word's arrival to its synthesis start,
    ms), ``skipped`` passed on from the LLM."""

    text: str | None = None
    chunk: int | None = None
    tts_ms: float | None = None
    talker_ms: float | None = None
    codec_ms: float | None = None
    codec_wait_ms: float | None = None
    tts_wait_ms: float | None = None
    skipped: str | None = None


class StageError(Meta):
    """A stage (or the backend) failed the request: ``stage`` names it (``None``: the backend or the relay),
    ``error`` says why; the turn is over."""

    error: str = "stage failure"
    stage: str | None = None


KINDS: dict[str, type[Meta]] = {
    k.__name__: k
    for k in (
        TurnRequest,
        AsrPiece,
        UtteranceRequest,
        Transcript,
        PartialTranscript,
        Encoded,
        DecoderOutput,
        AudioOutput,
        StageError,
    )
}
"""Every message kind by name: the tag of its JSON on the wire."""


def meta_to_wire(meta: Meta) -> bytes:
    """``meta`` as its kind's name, a NUL byte, then its JSON (``None`` fields left out)."""
    return type(meta).__name__.encode() + b"\0" + meta.model_dump_json(exclude_none=True).encode()


def meta_from_wire(data: bytes, request_id: str = "") -> Meta:
    """The typed meta of :func:`meta_to_wire`'s bytes, validated.

    Raises:
        EdgeMessageError: no kind tag, an unknown kind, not JSON, or fields that do not fit the kind (named).
    """
    name, sep, body = bytes(data).partition(b"\0")
    kind = KINDS.get(name.decode(errors="replace")) if sep else None
    if kind is None:
        raise EdgeMessageError(f"request {request_id}: message meta of no known kind ({name[:40]!r})")
    try:
        return kind.model_validate_json(body)
    except ValidationError as e:
        raise EdgeMessageError(f"request {request_id}: {kind.__name__}: {_where(e)}") from None


def validated(kind: type[Meta], fields: dict[str, Any], request_id: str = "") -> Meta:
    """``kind`` built from ``fields``, validated.

    Raises:
        EdgeMessageError: a field of the wrong type, unknown or missing (each named).
    """
    try:
        return kind.model_validate(fields)
    except ValidationError as e:
        raise EdgeMessageError(f"request {request_id}: {kind.__name__}: {_where(e)}") from None


def _where(e: ValidationError) -> str:
    """Each failing field of ``e`` and why, ``; ``-separated."""
    return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())


@dataclass
class StageMessage:
    """One chunk of a request's stream on a stage edge: named tensors, the typed ``meta`` of its kind and
    ``last`` (the request's stream on this edge ends)."""

    request_id: str
    tensors: dict[str, torch.Tensor]
    meta: Meta
    last: bool = False


def is_partial_transcript(msg: StageMessage) -> bool:
    """Whether ``msg`` is the ASR stage's partial transcript of a turn still being spoken: it goes to the
    orchestrator (captions), and downstream only as a prefill hint (:func:`goes_downstream`)."""
    return isinstance(msg.meta, PartialTranscript)


def goes_downstream(msg: StageMessage) -> bool:
    """Whether a stage's output ``msg`` goes to the next stage: everything but partial transcripts, and those
    too when they carry the turn's ``prefill`` context (the LLM stage's prefill hints)."""
    return not isinstance(msg.meta, PartialTranscript) or msg.meta.prefill is not None
