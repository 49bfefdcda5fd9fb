"""The session ↔ orchestrator contract: start a reply to a user turn, stream it, cancel it.

A :class:`Responder` turns one committed user turn (16 kHz mono float32 audio + history) into a
stream of typed :data:`ReplyEvent` s. :class:`OrchestratorResponder` is the real one, over
:class:`~omniduplex.pipeline.orchestrator.Orchestrator`; tests script their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from omniduplex.pipeline.orchestrator import Orchestrator


@dataclass
class ReplyTextDelta:
    """A piece of the reply's transcript."""

    text: str


@dataclass
class ReplyAudioChunk:
    """Reply audio: float32 mono PCM at the responder's ``output_rate`` (Hz)."""

    pcm: np.ndarray


@dataclass
class ReplyDone:
    """The reply is complete; pipeline ``metrics``: ``ttfp_ms``, ``e2el_ms``, ``rtf``, ``audio_s``."""

    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ReplyFailed:
    """The reply ended early: ``error`` is ``"cancelled"`` after :meth:`Responder.cancel`, else the cause."""

    error: str


ReplyEvent = ReplyTextDelta | ReplyAudioChunk | ReplyDone | ReplyFailed


class Responder(Protocol):
    """Where replies come from.

    Contract: after :meth:`start`, :meth:`events` yields the turn's events and always ends with
    exactly one :class:`ReplyDone` or :class:`ReplyFailed`; the caller must consume it to that end
    (that is what frees the turn). :meth:`cancel` makes the stream end with ``ReplyFailed("cancelled")``
    promptly and frees the turn's pipeline resources; it does nothing if the turn already ended.
    """

    output_rate: int
    """Sample rate of :class:`ReplyAudioChunk` PCM (Hz)."""

    def start(self, turn_id: str, waveform: np.ndarray, history: list[list[str]]) -> None: ...

    def events(self, turn_id: str) -> AsyncIterator[ReplyEvent]: ...

    def cancel(self, turn_id: str) -> None: ...


class OrchestratorResponder:
    """A :class:`Responder` over the pipeline orchestrator, shared by every session of a server.

    ``meta``: per-turn pipeline options merged into each turn (``sampling``, ``talker_sampling``,
    ``speaker``, ``system_prompt``); ``history`` is set per turn.
    """

    def __init__(self, orchestrator: Orchestrator, meta: dict | None = None) -> None:
        self.orch, self.meta = orchestrator, dict(meta or {})
        self.output_rate = orchestrator.output_rate

    def start(self, turn_id: str, waveform: np.ndarray, history: list[list[str]]) -> None:
        self.orch.submit(waveform, {**self.meta, "history": history}, request_id=turn_id)

    async def events(self, turn_id: str) -> AsyncIterator[ReplyEvent]:
        async for ev in self.orch.events(turn_id):
            if ev.kind == "text":
                yield ReplyTextDelta(ev.text)
            elif ev.kind == "audio":
                yield ReplyAudioChunk(ev.pcm)
            elif ev.kind == "done":
                yield ReplyDone(dict(ev.metrics))
            else:
                yield ReplyFailed(ev.error or "pipeline error")

    def cancel(self, turn_id: str) -> None:
        self.orch.cancel(turn_id)
