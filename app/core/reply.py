"""A reply as the conversation tracks it while it plays (:class:`Reply`) and what it became
(:class:`ReplyRecord`): its text, its audio chunks with the words each speaks, and how much was generated and
played, in samples at the session's output rate."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from omniduplex.app.core.history import truncate_aligned, truncate_reply
from omniduplex.app.core.tools import FunctionCall

log = logging.getLogger("omniduplex.session")


@dataclass
class Reply:
    """A reply: counters in samples at the output rate, times on the session clock (s)."""

    turn_id: str
    t_commit: float
    t_speech_end: float
    text: list[str] = field(default_factory=list)
    chunks: list[tuple[int, str]] = field(default_factory=list)  # (generated at chunk end, words spoken)
    spoken: int = 0  # chunks whose audio has started playing (ReplySpoken emitted)
    generated: int = 0
    played: int = 0
    t_first_audio: float | None = None
    generation_done: bool = False
    interrupted_at: float | None = None
    ended: bool = False
    # what the responder was started with (continuations reuse it)
    options: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""  # the pipeline request producing it now ("" = turn_id; a continuation's own id)
    calls: list[FunctionCall] = field(default_factory=list)  # server-run calls made, not run yet
    n_calls: int = 0  # function calls the reply made (all its continuations included)
    client_calls: int = 0  # calls its client must answer (a continuation waits for none)
    segments: int = 0  # continuations started after server-run calls
    filled: bool = False  # a filler was said: as a server-run call opened, or while a slow one ran
    made: set[tuple[str, str]] = field(default_factory=set)  # (name, canonical arguments) of calls made
    repeated: bool = False  # the last segment repeated a call already made (its continuation calls no tool)
    failed: str = ""  # the pipeline failed it (why); the apology then plays, and it ends with reason error

    def __post_init__(self) -> None:
        self.request_id = self.request_id or self.turn_id

    @property
    def full_text(self) -> str:
        """The reply's text as generated (its deltas joined; its chunks' words when it sent no text)."""
        return "".join(self.text) or " ".join(said for _, said in self.chunks)

    def kept_text(self, rate: int) -> str:
        """What the user heard of it (``rate``: the output rate, Hz): a prefix of its generated text, by the
        audio stage's text↔audio alignment when its chunks carry their words
        (:func:`~.history.truncate_aligned`), else in proportion to played audio
        (:func:`~.history.truncate_reply`)."""
        text = self.full_text
        if self.chunks:
            kept = truncate_aligned(self.chunks, self.played, text)
            if kept is not None:
                return kept
            log.warning("%s: the chunks' words are not the reply's text; truncating by time", self.turn_id)
        return truncate_reply(text, 1000.0 * self.played / rate, 1000.0 * self.generated / rate)

    def due_captions(self) -> list[tuple[str, int]]:
        """The aligned chunks whose audio has started playing since the last call, as ``(words, start)``
        (``start``: the chunk's first sample): captions in step with the audio, not with generation."""
        due = []
        while self.spoken < len(self.chunks):
            start = self.chunks[self.spoken - 1][0] if self.spoken else 0
            if self.played <= start:
                break
            due.append((self.chunks[self.spoken][1], start))
            self.spoken += 1
        return due


@dataclass(frozen=True)
class ReplyRecord:
    """What a reply became: ``text`` as generated, ``kept`` what the history keeps of it ("" = nothing),
    ``played_ms`` / ``generated_ms`` of its audio, ``ended`` once it no longer plays."""

    turn_id: str
    text: str
    kept: str
    played_ms: float
    generated_ms: float
    ended: bool
