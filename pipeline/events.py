"""The one event vocabulary from the orchestrator to its consumers (the session's responder, CLI, benchmarks).

:meth:`~.orchestrator.Orchestrator.events` yields these typed events; the session's
:class:`~omniduplex.app.core.replies.Responder` passes them on as they are. Each has a ``kind``
(``transcript``, ``text``, ``audio``, ``done``, ``error``) for code that switches on it, and the
``request_id`` of its turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np


@dataclass
class UserTranscript:
    """What the user said in this turn (ASR stage), with ``words`` as ``[word, start_s, end_s]``."""

    text: str
    words: list = field(default_factory=list)
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
    """The turn ended early: ``error`` is ``"cancelled"`` after a cancel, else the cause."""

    error: str
    request_id: str = ""
    kind: ClassVar[str] = "error"


TurnEvent = UserTranscript | ReplyTextDelta | ReplyAudioChunk | ReplyDone | ReplyFailed
"""Something a turn produced; its events end with exactly one :class:`ReplyDone` or :class:`ReplyFailed`."""
