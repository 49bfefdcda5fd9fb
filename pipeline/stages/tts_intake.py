"""What the TTS stages share on the way in: the turns aborted recently, the check of a text delta and a
turn's text split into clauses."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TypeVar

from omniduplex.pipeline.messages import DecoderOutput, StageMessage
from omniduplex.pipeline.text.clauses import ClauseSplitter

ABORTED_MEMORY = 1024
"""How many aborted turn ids a TTS stage remembers (the oldest is forgotten first)."""


class AbortedTurns:
    """The last :data:`ABORTED_MEMORY` aborted turn ids: late text for them is dropped."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, request_id: str) -> None:
        self._ids[request_id] = None
        while len(self._ids) > ABORTED_MEMORY:
            self._ids.popitem(last=False)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids


def text_delta(msg: StageMessage, aborted: AbortedTurns) -> DecoderOutput | None:
    """``msg``'s :class:`DecoderOutput`, or ``None`` when its turn was aborted (the message is dropped).

    Raises ValueError: not a ``DecoderOutput`` (this turn only).
    """
    if msg.request_id in aborted:
        return None
    if not isinstance(msg.meta, DecoderOutput):
        raise ValueError(
            f"turn {msg.request_id}: the TTS stage takes DecoderOutput, got {type(msg.meta).__name__}"
        )
    return msg.meta


@dataclass
class TextTurn:
    """A reply's text on its way to speech: the clauses split off so far and not yet spoken. A stage's own
    turn subclasses this with keyword-only fields (its voice, decoder, resampler...)."""

    splitter: ClauseSplitter
    skipped: str | None  # the LLM's ``skipped`` (first message), copied onto every message of the turn
    clauses: deque[str] = field(default_factory=deque)
    finished: bool = False  # the reply's text is complete
    chunk: int = 0  # what the stage has emitted of it (messages, or clauses spoken)
    silent: bool = False  # a text-only turn (meta ``spoken: false``): no clauses, only the closing message

    def add_text(self, delta: str, last: bool) -> None:
        """Split ``delta`` into clauses (none for a silent turn); ``last`` ends the text, flushing the
        splitter once (a repeated ``last`` is ignored)."""
        if not self.silent:
            self.clauses.extend(self.splitter.push(delta))
        if last and not self.finished:
            if not self.silent:
                self.clauses.extend(self.splitter.flush())
            self.finished = True


T = TypeVar("T", bound=TextTurn)


def add_text_delta(
    msg: StageMessage,
    aborted: AbortedTurns,
    turns: MutableMapping[str, T],
    new_turn: Callable[[DecoderOutput], T],
) -> None:
    """A TTS stage's ``submit``: add ``msg``'s text delta to its turn in ``turns`` (opened with
    ``new_turn(meta)`` on the turn's first message); ``last`` closes the turn's text. A message of an
    aborted turn is dropped.

    Raises ValueError: not a ``DecoderOutput`` (this turn only).
    """
    meta = text_delta(msg, aborted)
    if meta is None:
        return
    t = turns.get(msg.request_id)
    if t is None:
        t = turns[msg.request_id] = new_turn(meta)
    t.add_text(meta.text or "", msg.last)
