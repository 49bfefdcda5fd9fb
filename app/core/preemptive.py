"""Preemptive generation: the reply to a spoken turn started during a pause that may end it, its events held.

If the turn then ends with the same audio and the same context (:meth:`Speculation.answers`), the
conversation adopts that reply as the turn's, and its held events play out as if it had started then, only
sooner; otherwise (speech resumed, the history changed) it is cancelled and nothing of it is seen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omniduplex.app.core.replies import ReplyEvent, ReplyFailed, Responder

log = logging.getLogger("omniduplex.session")

_END = object()  # closes a speculation's held events


@dataclass
class Speculation:
    """A reply started before its turn ended: its request (``wav``: the turn so far, 16 kHz mono float32;
    ``history`` and ``options`` as :meth:`Responder.start` got them), and its events held until it is
    adopted."""

    turn_id: str
    wav: np.ndarray
    history: list[list[str]]
    options: dict[str, Any]
    held: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def answers(self, wav: np.ndarray, history: list[list[str]], options: dict[str, Any]) -> bool:
        """Whether a turn ending now with audio ``wav``, in this context, is the one this reply answers (the
        same samples, history and options)."""
        same = self.history == history and self.options == options
        return same and self.wav.shape == wav.shape and bool(np.array_equal(self.wav, wav))

    async def hold(self, responder: Responder) -> None:
        """Drain the reply's stream to its end (the responder's contract) into :attr:`held`."""
        try:
            async for ev in responder.events(self.turn_id):
                self.held.put_nowait(ev)
        except Exception as e:
            log.exception("%s: preemptive reply stream failed", self.turn_id)
            self.held.put_nowait(ReplyFailed(str(e)))
        finally:
            self.held.put_nowait(_END)

    async def events(self) -> AsyncIterator[ReplyEvent]:
        """The held events, then the rest as they come, to the stream's end."""
        while (ev := await self.held.get()) is not _END:
            yield ev
