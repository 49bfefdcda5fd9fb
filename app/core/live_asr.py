"""Live transcription of the turn being spoken: its audio goes to the ASR while the user speaks, so that at
end of turn only the tail is left to decode, and what was heard so far becomes live captions.

:class:`LiveTranscriber` feeds the open speech segment to a responder that can transcribe while the user
speaks (:class:`~omniduplex.app.core.replies.LiveTranscription`, the cascade's ASR stage) every ``feed_ms``
of new
audio, under the turn id the segment will have once committed, and turns the partial transcripts that come
back into :class:`~omniduplex.app.core.events.UserTranscriptPartial` events. A segment that does not become a
turn is cancelled in the pipeline. :class:`AgreedPrefix` makes the append-only deltas of those events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from omniduplex.app.core.audio.pcm import FRAME_MS
from omniduplex.app.core.events import SessionEvent, UserTranscriptPartial

log = logging.getLogger("omniduplex.session")

FEED_MS = 400
"""New speech (ms of 20 ms frames) between two feeds of the open turn: within the 300–500 ms the ASR
stage's hypothesis period (0.4 s) is made for; shorter only adds relay messages."""


PAUSE_FRAMES = 5
"""Unvoiced 20 ms frames (100 ms) after which the open turn is fed at once: the ASR stage's
:data:`~omniduplex.models.cascade.streaming_asr.PAUSE_HYPOTHESIS_MS`."""


class AgreedPrefix:
    """Append-only deltas from revisable partial transcripts.

    A word is agreed once it is in the partial's ``stable`` prefix or two successive partials have it at
    the same place (local agreement); only agreed words are sent, each once, so the deltas of a turn joined
    never need revising (the final transcript may still differ: it is the ASR's last word).
    """

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.prev: list[str] = []

    def update(self, text: str, stable: str) -> str:
        """The words ``text`` adds to the agreed prefix, with a leading space after the first ("" if none)."""
        words, fixed = text.split(), stable.split()
        common = 0
        while common < min(len(words), len(self.prev)) and words[common] == self.prev[common]:
            common += 1
        agreed = words[:common]
        if len(fixed) > common and words[: len(fixed)] == fixed:
            agreed = fixed
        self.prev = words
        n = len(self.sent)
        if len(agreed) <= n or agreed[:n] != self.sent:
            return ""
        self.sent = agreed
        return (" " if n else "") + " ".join(agreed[n:])


class LiveTranscriber:
    """The open segment of one session, fed to the responder while it is spoken. Event loop thread only.

    Args:
        name: the session id (events' ``session_id``).
        responder: has ``feed_audio`` (:class:`~omniduplex.app.core.replies.LiveTranscription`) and
        ``cancel``;
            without ``feed_audio``, or when it returns ``False``, nothing is fed and turns go whole.
        emit: receives the partial transcript events.
        new_turn_id: reserves the id the turn will be committed under.
        feed_ms: new audio between feeds (ms, a multiple of 20).
        context: ``() -> (history, options)`` of a reply started now; given with a turn's first feed, so
            the LLM can prefill the conversation while the user speaks.
    """

    def __init__(
        self,
        name: str,
        responder: Any,
        emit: Callable[[SessionEvent], None],
        new_turn_id: Callable[[], str],
        feed_ms: int = FEED_MS,
        context: Callable[[], tuple[list[list[str]], dict[str, Any]]] | None = None,
    ) -> None:
        self.name, self.responder, self.emit, self.new_turn_id = name, responder, emit, new_turn_id
        self.context = context
        self.every = max(1, feed_ms // FRAME_MS)
        self.supported = callable(getattr(responder, "feed_audio", None))
        self.turn_id: str | None = None
        self.fed = 0  # frames of the open segment fed so far
        self.agreed = AgreedPrefix()
        self._segment: list[np.ndarray] | None = None  # the segment ``agreed`` belongs to (its frame list)

    def update(
        self, frames: list[np.ndarray], in_speech: bool, wanted: bool = True, pause: bool = False
    ) -> None:
        """After each input frame: ``frames`` the open segment's 20 ms int16 frames so far, ``in_speech``
        whether it is open, ``wanted`` whether its turn will be sent at once when it ends (else nothing is
        fed), ``pause`` whether a pause just began (:data:`PAUSE_FRAMES` unvoiced frames: maybe the end of
        turn). Feeds the new frames once ``feed_ms`` of them piled up, or at once when a pause begins (the
        ASR then decodes all the sound before it, and if the turn ends there, nothing is left to decode); a
        segment gone without becoming a turn (:meth:`take` not called) is cancelled."""
        if not in_speech or not wanted or not self.supported:
            self.drop()
            return
        new = len(frames) - self.fed
        if new < self.every and not (pause and new > 0):
            return
        if self.turn_id is None:
            self.turn_id, self.fed = self.new_turn_id(), 0
            if frames is not self._segment:  # a new segment; the same one goes on after a preemptive reply
                self.agreed, self._segment = AgreedPrefix(), frames  # was dropped: its captions go on
        turn_id = self.turn_id
        samples = np.concatenate(frames[self.fed :]).astype(np.float32) / 32768.0
        context = self.context() if self.context is not None and self.fed == 0 else None
        try:
            ok = self.responder.feed_audio(
                turn_id, samples, lambda t, s: self._partial(turn_id, t, s), context
            )
        except Exception:
            log.exception("%s: live transcription failed; the turn goes whole at its end", turn_id)
            ok = None
        if ok is False and self.fed == 0:  # this responder never can: nothing was sent
            self.supported, self.turn_id = False, None
            return
        if not ok:  # an error: this turn goes whole, the next one is fed again
            self.drop()
            return
        self.fed = len(frames)

    def take(self) -> str | None:
        """The turn has ended: the id it was fed under (commit it under that id; the responder's ``start``
        then finishes it), or ``None`` when nothing was fed."""
        turn_id, self.turn_id, self.fed = self.turn_id, None, 0
        return turn_id

    def drop(self) -> None:
        """Cancel the fed segment in the pipeline (it will not become a turn)."""
        turn_id, self.turn_id, self.fed = self.turn_id, None, 0
        if turn_id is not None:
            self.responder.cancel(turn_id)

    def _partial(self, turn_id: str, text: str, stable: str) -> None:
        if turn_id != self.turn_id:
            return  # the turn was committed or dropped meanwhile
        delta = self.agreed.update(text, stable)
        self.emit(UserTranscriptPartial(self.name, turn_id, text=text, stable=stable, delta=delta))
