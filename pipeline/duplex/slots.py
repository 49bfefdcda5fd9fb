"""Session slots of the duplex frame engine: sessions occupy rows ``0..n-1`` of every batched state, joins and
leaves are queued and applied between ticks, and a leaving session's row is filled by the last row's session
(swap-remove), so a step always reads a contiguous prefix of the batch and the others never stall."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from omniduplex.models.moshi.config import FRAME_SAMPLES

MAX_QUEUED_FRAMES = 25
"""Input frames a session may have waiting (2 s); :meth:`Slots.push` refuses more."""


@dataclass
class DuplexSettings:
    """A session's sampling settings (Moshi's defaults, ``moshi/models/lm.py`` ``LMGen``): temperature (<= 0
    greedy) and top-k for the text and for the audio tokens."""

    temp_text: float = 0.7
    top_k_text: int = 25
    temp_audio: float = 0.8
    top_k_audio: int = 250


@dataclass
class SessionState:
    """One session's host-side record: queued input frames (float32 ``[1920]``, 24 kHz) and its counters."""

    session_id: str
    settings: DuplexSettings
    inbox: deque = field(default_factory=deque)
    frames: int = 0
    input_underruns: int = 0
    """Ticks that found no input frame queued (the model heard silence)."""
    overruns: int = 0
    """Ticks of this session that took longer than the frame budget."""
    events: list = field(default_factory=list)
    schedule: object = None
    """The prompt's forced tokens, int64 ``[steps, 1 + dep_q]`` (:func:`.prompts.prompt_schedule`)."""
    prompt_left: int = 0
    """Ticks of the prompt prefill still to run (the session hears silence and is sent silence meanwhile)."""


class Slots:
    """Row bookkeeping. ``capacity``: rows the batched state holds.

    ``join`` / ``leave`` raise ValueError (full, duplicate or unknown id) and take effect at :meth:`apply`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.order: list[str] = []
        """Session id of each row, in row order."""
        self.sessions: dict[str, SessionState] = {}
        self.joining: list[str] = []
        self.leaving: list[str] = []

    def join(self, session_id: str, settings: DuplexSettings | None, schedule=None) -> None:
        """Queue a join; ``schedule``: the prompt's forced tokens (or ``None``)."""
        if session_id in self.sessions:
            raise ValueError(f"session {session_id!r} already joined")
        if len(self.sessions) >= self.capacity:
            raise ValueError(f"duplex engine full ({self.capacity} sessions)")
        s = SessionState(session_id, settings or DuplexSettings())
        if schedule is not None:
            s.schedule, s.prompt_left = schedule, int(schedule.shape[0])
        self.sessions[session_id] = s
        self.joining.append(session_id)

    def leave(self, session_id: str) -> None:
        if session_id not in self.sessions:
            raise ValueError(f"unknown session {session_id!r}")
        if session_id in self.joining:
            self.joining.remove(session_id)
            del self.sessions[session_id]
        elif session_id not in self.leaving:
            self.leaving.append(session_id)

    def push(self, session_id: str, pcm: np.ndarray) -> None:
        """Queue one input frame: float32 ``[1920]`` in [-1, 1] at 24 kHz. Raises ValueError for an unknown
        session, a frame of another size, non-finite samples, or a full queue (nothing is queued then)."""
        s = self.sessions.get(session_id)
        if s is None or session_id in self.leaving:
            raise ValueError(f"unknown session {session_id!r}")
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if pcm.shape[0] != FRAME_SAMPLES:
            raise ValueError(
                f"a duplex frame is {FRAME_SAMPLES} samples (80 ms at 24 kHz), got {pcm.shape[0]}"
            )
        if not np.isfinite(pcm).all():
            raise ValueError("audio frame holds NaN or inf samples")
        if len(s.inbox) >= MAX_QUEUED_FRAMES:
            raise ValueError(f"session {session_id!r} has {MAX_QUEUED_FRAMES} frames queued already")
        s.inbox.append(pcm)

    def apply(self, move, reset) -> None:
        """Apply queued leaves then joins: ``move(src, dst)`` copies a row's state, ``reset(rows)`` makes rows
        fresh (``rows``: list of row indices)."""
        for sid in self.leaving:
            row, last = self.order.index(sid), len(self.order) - 1
            if row != last:
                move(last, row)
                self.order[row] = self.order[last]
            self.order.pop()
            del self.sessions[sid]
        self.leaving.clear()
        if self.joining:
            start = len(self.order)
            self.order.extend(self.joining)
            reset(list(range(start, len(self.order))))
            self.joining.clear()
