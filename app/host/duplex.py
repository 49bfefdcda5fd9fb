"""The duplex model of ``omniduplex serve --duplex-model DIR``: one :class:`~omniduplex.pipeline.duplex.engine
.DuplexEngine` over a loaded Moshi folder, ticked every 80 ms by a :class:`~omniduplex.pipeline.duplex.clock
.DuplexClock` thread, beside the cascade. A session (``ws /v1/realtime?duplex=1``) joins the engine, pushes
its 80 ms input frames and reads its output frames from an asyncio queue that the clock thread fills
(:meth:`DuplexService.join`); leaving frees its engine row before the next tick, the others keep ticking.

Resume: a connection that drops may :meth:`~DuplexService.park` its session instead of leaving: the engine row
(the model's state) stays and keeps ticking (the model hears silence), its output frames are dropped, and the
connection's own record (what was played) is kept with it, for ``resume_s`` seconds; :meth:`~DuplexService.
resume` hands both to a new connection (``session.resume``); past the grace period the row is freed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import numpy as np
import torch

from omniduplex.pipeline.duplex.engine import DuplexEngine, DuplexFrame
from omniduplex.pipeline.duplex.prompts import DuplexPrompt, check_prompt, encode_voice_prompt

log = logging.getLogger("omniduplex.duplex")

OUTBOX_FRAMES = 50
"""Output frames (4 s) a session may leave unread; older ones are dropped and counted (a stalled client)."""


LEAVE_WAIT_S = 1.0
"""How long a join waits for a pending leave to free a row (a few ticks)."""


def is_moshi_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a Moshi checkpoint: a ``config.json`` with ``model_type`` ``moshi``
    (written by ``init-model --arch moshi-*``) or Kyutai's published LM keys (``depformer_dim``)."""
    import json

    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and (raw.get("model_type") == "moshi" or "depformer_dim" in raw)


RESUME_S = 30.0
"""Default grace period of a dropped duplex session (s): a reconnect within it resumes the session."""


class DuplexFull(RuntimeError):
    """Every row of the frame engine is taken."""


class SessionNotFound(KeyError):
    """No parked session of that id: never known, resumed already, or its grace period expired."""


class DuplexService:
    """Load ``folder`` (a Moshi checkpoint, :func:`omniduplex.models.moshi.checkpoint.load_moshi`) and serve
    up to ``capacity`` sessions at once on one engine.

    Args:
        folder: the Moshi checkpoint folder.
        capacity: engine rows (concurrent duplex sessions).
        graph_mode: the engine's ``graph_mode`` (``off``: eager; ``auto``: CUDA graphs on a GPU).
        budget_ms: a tick's budget (80 ms, one frame); a longer tick is told to its sessions.
        resume_s: how long a parked session waits for its client (s; :meth:`park`).
        threads: torch threads of the ticking thread (:class:`~omniduplex.pipeline.duplex.clock.DuplexClock`).
    """

    def __init__(
        self,
        folder: str | Path,
        capacity: int = 4,
        graph_mode: str = "off",
        budget_ms: float = 80.0,
        resume_s: float = RESUME_S,
        threads: int | None = 1,
    ) -> None:
        self.folder, self.capacity, self.graph_mode = Path(folder), capacity, graph_mode
        self.threads = threads
        self.budget_ms, self.resume_s = budget_ms, resume_s
        self._parked: dict[str, tuple[object, asyncio.TimerHandle]] = {}
        self.resumed = self.expired = 0
        self.engine: DuplexEngine | None = None
        self.clock = None
        self.pad_ids: set[int] = set()
        """Text ids that carry no text (Moshi's padding and end-of-padding tokens, 3 and 0)."""
        self.dropped_frames = 0
        self._outboxes: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._prompt_lock = threading.Lock()
        self.prompt_mimi = None

    def load(self) -> None:
        """Load the folder and build the engine (blocking; call it in a worker thread).

        Raises ValueError: not a Moshi folder (``load_moshi``)."""
        import copy

        from omniduplex.models.moshi.checkpoint import load_moshi

        models = load_moshi(self.folder)
        self.pad_ids = {0, int(models.config.get("existing_text_padding_id", 3))}
        self.prompt_mimi = copy.deepcopy(models.mimi)  # one-shot encodes of voice prompts, off the engine
        self.engine = DuplexEngine(
            models, capacity=self.capacity, budget_ms=self.budget_ms, graph_mode=self.graph_mode
        )
        log.info("duplex model %s loaded (%d rows)", self.folder, self.capacity)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the clock; output frames are handed to the sessions' queues on ``loop``."""
        from omniduplex.pipeline.duplex.clock import DuplexClock

        assert self.engine is not None, "load() first"
        self._loop = loop
        self.clock = DuplexClock(self.engine, self._on_frames, threads=self.threads)
        self.clock.start()

    def stop(self) -> None:
        if self.clock is not None:
            self.clock.stop()

    # sessions ---------------------------------------------------------------------------------------
    async def join(self, session_id: str, prompt: DuplexPrompt | None = None) -> asyncio.Queue:
        """Join the engine from the next tick on (prefilled with ``prompt`` first, when given); returns the
        queue of the session's ``(DuplexFrame, events)`` (``events``: the engine's ``tick_overrun`` events of
        that tick). A row whose session left is free only after the next tick applies the leave: a join that
        finds the engine full (or its own id still leaving) while a leave is pending waits for it (at most
        :data:`LEAVE_WAIT_S`).

        Raises:
            DuplexFull: every row is taken.
            ValueError: a prompt the model cannot take (:func:`.prompts.check_prompt` of the duplex pipeline).
        """
        assert self.engine is not None
        if prompt is not None:
            lm = self.engine.lm
            check_prompt(prompt, lm.dep_q, lm.card, lm.text_card)
        q: asyncio.Queue = asyncio.Queue(OUTBOX_FRAMES)
        deadline = time.monotonic() + LEAVE_WAIT_S
        while True:
            with self._lock:
                try:
                    self.engine.join(session_id, prompt=prompt)
                    self._outboxes[session_id] = q
                    return q
                except ValueError as e:
                    if not self.engine.slots.leaving or time.monotonic() > deadline:
                        raise DuplexFull(str(e)) from None
            await asyncio.sleep(0.02)

    def encode_voice(self, pcm: np.ndarray) -> torch.Tensor:
        """A voice prompt's reference clip (float32 ``[samples]`` at 24 kHz) → its Mimi codes int64
        ``[frames, dep_q]`` (blocking: call it in a worker thread). Raises ValueError for a bad clip
        (:func:`~omniduplex.pipeline.duplex.prompts.encode_voice_prompt`)."""
        with self._prompt_lock:
            return encode_voice_prompt(self.prompt_mimi, torch.from_numpy(pcm), self.engine.lm.dep_q)

    def leave(self, session_id: str) -> None:
        """Free the session's row before the next tick (idempotent; a parked session is forgotten)."""
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            parked[1].cancel()
        with self._lock:
            if self._outboxes.pop(session_id, None) is not None:
                self.engine.leave(session_id)

    def park(self, session_id: str, record: object) -> None:
        """Keep a dropped connection's session for :attr:`resume_s` seconds: its engine row keeps ticking,
        ``record`` (the connection's own state, e.g. what was played) waits for :meth:`resume`; then the row
        is freed. Call it on the event loop."""
        if session_id not in self._outboxes:
            return
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.resume_s, self._expire, session_id)
        self._parked[session_id] = (record, timer)
        log.info("duplex session %s parked for %.0f s", session_id, self.resume_s)

    def resume(self, session_id: str) -> tuple[asyncio.Queue, object]:
        """Take a parked session back: returns its output queue (emptied: the frames of the gap were never
        heard) and the ``record`` given to :meth:`park`.

        Raises:
            SessionNotFound: no session of that id is parked (unknown, resumed already, or expired).
        """
        parked = self._parked.pop(session_id, None)
        if parked is None:
            raise SessionNotFound(session_id)
        record, timer = parked
        timer.cancel()
        q = self._outboxes[session_id]
        while not q.empty():
            q.get_nowait()
        self.resumed += 1
        return q, record

    def _expire(self, session_id: str) -> None:
        if session_id in self._parked:
            self.expired += 1
            log.info("duplex session %s: grace period over, row freed", session_id)
            self.leave(session_id)

    def push(self, session_id: str, pcm: np.ndarray) -> None:
        """Queue one input frame: float32 ``[1920]`` at 24 kHz. Raises ValueError (see ``Slots.push``)."""
        self.engine.push(session_id, pcm)

    def stats(self) -> dict:
        """``sessions`` (engine rows taken, parked ones included), ``parked``, ``resumed``, ``expired``,
        ``capacity``, ``ticks``, ``overrun_ticks``, ``late_ticks``, ``dropped_frames``."""
        e = self.engine
        return {
            "sessions": len(self._outboxes),
            "parked": len(self._parked),
            "resumed": self.resumed,
            "expired": self.expired,
            "capacity": self.capacity,
            "ticks": e.ticks if e else 0,
            "overrun_ticks": e.overrun_ticks if e else 0,
            "late_ticks": self.clock.late_ticks if self.clock else 0,
            "dropped_frames": self.dropped_frames,
        }

    # the clock thread -------------------------------------------------------------------------------
    def _on_frames(self, frames: list[DuplexFrame]) -> None:
        """Hand each frame to its session's queue on the event loop (the clock thread must not block)."""
        batch = []
        with self._lock:
            for f in frames:
                q = self._outboxes.get(f.session_id)
                if q is not None:
                    events = self.engine.events(f.session_id) if f.overrun else []
                    batch.append((q, f, events))
        if batch and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, batch)

    def _deliver(self, batch) -> None:
        for q, f, events in batch:
            if f.session_id in self._parked:  # nobody listens: the model's audio of the gap is not kept
                continue
            if q.full():  # a client that does not read: keep the newest audio
                q.get_nowait()
                self.dropped_frames += 1
            q.put_nowait((f, events))
