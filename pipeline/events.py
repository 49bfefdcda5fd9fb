"""The one event vocabulary from the orchestrator to its consumers (the session's responder, CLI, benchmarks).

:meth:`~.orchestrator.Orchestrator.events` yields these typed events; the session's
:class:`~omniduplex.app.core.replies.Responder` passes them on as they are. Each has a ``kind``
(``transcript``, ``text``, ``tool_call``, ``audio``, ``done``, ``error``) for code that switches on it, and
the ``request_id`` of its turn. A reply's function calls (``tool_call``: :data:`CallEvent`) come from the LLM
stage's call events (:mod:`.stages.tool_calls`), before the text of the same message; they are never
spoken (:mod:`omniduplex.app.core.tools` says who runs them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass
class UserTranscript:
    """What the user said in this turn (ASR stage), with ``words`` as ``[word, start_s, end_s]``."""

    text: str
    words: list[list[str | float]] = field(default_factory=list)
    request_id: str = ""
    kind: ClassVar[str] = "transcript"


@dataclass
class ReplyTextDelta:
    """A piece of the reply's transcript."""

    text: str
    request_id: str = ""
    kind: ClassVar[str] = "text"


@dataclass
class ReplyAudioChunk:
    """Reply audio: float32 mono PCM ``[n]`` at the graph's output rate (Hz).

    ``text``: the words these samples speak, when the audio stage knows them (the cascade's TTS speaks
    clause by clause); "" otherwise. Chunk texts concatenate to the spoken reply: the alignment used to
    keep only what was played of an interrupted reply."""

    pcm: np.ndarray
    text: str = ""
    request_id: str = ""
    kind: ClassVar[str] = "audio"


@dataclass
class ReplyDone:
    """The reply is complete; ``metrics``: ``ttfp_ms``, ``e2el_ms``, ``rtf``, ``audio_s`` (and, for the
    cascade, ``asr_ms``, ``llm_first_clause_ms``, ``tts_first_chunk_ms``; for the Qwen3-TTS graph
    ``talker_first_frame_ms``, ``codec_first_chunk_ms``)."""

    metrics: dict[str, float] = field(default_factory=dict)
    request_id: str = ""
    kind: ClassVar[str] = "done"


@dataclass
class ReplyFailed:
    """The turn ended early: ``error`` is ``"cancelled"`` after a cancel, else the cause; ``stage``: the stage
    whose step, input or output failed it (``"orchestrator"`` when reading an output failed; ``None`` after
    a cancel, or when no stage is to blame)."""

    error: str
    request_id: str = ""
    stage: str | None = None
    kind: ClassVar[str] = "error"


@dataclass(frozen=True)
class FunctionCall:
    """One call the model made: ``call_id`` (``call_`` + 24 hex digits, the OpenAI shape), the function's
    ``name`` and its ``arguments`` (a JSON object as a string; with grammar-constrained decoding it always
    parses and satisfies the tool's schema)."""

    call_id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> dict[str, Any]:
        """``arguments`` as a dict.

        Raises:
            ValueError: not a JSON object (an unconstrained model's malformed call).
        """
        args = json.loads(self.arguments)
        if not isinstance(args, dict):
            raise ValueError(f"arguments of {self.name} must be a JSON object, got {self.arguments!r}")
        return args


@dataclass
class CallStarted:
    """The model started call ``index`` (0, 1, ... within the reply) of function ``name``; ``filler``: the
    words the reply says as the call opens (the turn's ``call_filler``, spoken in the same request's audio
    while the call is written and run; ``""``: none)."""

    call_id: str
    name: str
    index: int = 0
    request_id: str = ""
    filler: str = ""
    kind: ClassVar[str] = "tool_call"
    phase: ClassVar[str] = "started"


@dataclass
class CallArgumentsDelta:
    """More of call ``call_id``'s arguments text, as the model writes it."""

    call_id: str
    delta: str
    request_id: str = ""
    kind: ClassVar[str] = "tool_call"
    phase: ClassVar[str] = "arguments_delta"


@dataclass
class CallDone:
    """Call ``call_id`` is complete: its whole ``arguments`` (a JSON object as a string)."""

    call_id: str
    name: str
    arguments: str
    request_id: str = ""
    kind: ClassVar[str] = "tool_call"
    phase: ClassVar[str] = "done"

    @property
    def call(self) -> FunctionCall:
        return FunctionCall(self.call_id, self.name, self.arguments)


@dataclass
class CallFailed:
    """Call ``call_id`` could not be read (cut off by the token budget, or malformed): ``error`` says why.
    It joins no history and is not run."""

    call_id: str
    name: str
    error: str
    request_id: str = ""
    kind: ClassVar[str] = "tool_call"
    phase: ClassVar[str] = "failed"


CallEvent = CallStarted | CallArgumentsDelta | CallDone | CallFailed
"""One function-call event of a reply."""

TurnEvent = UserTranscript | ReplyTextDelta | CallEvent | ReplyAudioChunk | ReplyDone | ReplyFailed
"""Something a turn produced; its events end with exactly one :class:`ReplyDone` or :class:`ReplyFailed`."""
