"""The duplex model of ``omniduplex serve --duplex-model DIR``: one :class:`~omniduplex.pipeline.duplex.engine
.DuplexEngine` over a loaded Moshi folder, ticked every 80 ms by a :class:`~omniduplex.pipeline.duplex.clock
.DuplexClock` thread, beside the cascade. A session (``ws /v1/realtime?duplex=1``) joins the engine, pushes
its 80 ms input frames and reads its output frames from an asyncio queue that the clock thread fills
(:meth:`DuplexService.join`); leaving frees its engine row before the next tick, the others keep ticking.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import numpy as np

from omniduplex.pipeline.duplex.engine import DuplexEngine, DuplexFrame

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


class DuplexFull(RuntimeError):
    """Every row of the frame engine is taken."""


class DuplexService:
    """Load ``folder`` (a Moshi checkpoint, :func:`omniduplex.models.moshi.checkpoint.load_moshi`) and serve
    up to ``capacity`` sessions at once on one engine.

    Args:
        folder: the Moshi checkpoint folder.
        capacity: engine rows (concurrent duplex sessions).
        graph_mode: the engine's ``graph_mode`` (``off``: eager; ``auto``: CUDA graphs on a GPU).
        budget_ms: a tick's budget (80 ms, one frame); a longer tick is told to its sessions.
    """

    def __init__(
        self, folder: str | Path, capacity: int = 4, graph_mode: str = "off", budget_ms: float = 80.0
    ) -> None:
        self.folder, self.capacity, self.graph_mode = Path(folder), capacity, graph_mode
        self.budget_ms = budget_ms
        self.engine: DuplexEngine | None = None
        self.clock = None
        self.pad_ids: set[int] = set()
        """Text ids that carry no text (Moshi's padding and end-of-padding tokens, 3 and 0)."""
        self.dropped_frames = 0
        self._outboxes: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the folder and build the engine (blocking; call it in a worker thread).

        Raises ValueError: not a Moshi folder (``load_moshi``)."""
        from omniduplex.models.moshi.checkpoint import load_moshi

        models = load_moshi(self.folder)
        self.pad_ids = {0, int(models.config.get("existing_text_padding_id", 3))}
        self.engine = DuplexEngine(
            models, capacity=self.capacity, budget_ms=self.budget_ms, graph_mode=self.graph_mode
        )
        log.info("duplex model %s loaded (%d rows)", self.folder, self.capacity)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the clock; output frames are handed to the sessions' queues on ``loop``."""
        from omniduplex.pipeline.duplex.clock import DuplexClock

        assert self.engine is not None, "load() first"
        self._loop = loop
        self.clock = DuplexClock(self.engine, self._on_frames)
        self.clock.start()

    def stop(self) -> None:
        if self.clock is not None:
            self.clock.stop()

    # sessions ---------------------------------------------------------------------------------------
    async def join(self, session_id: str) -> asyncio.Queue:
        """Join the engine from the next tick on; returns the queue of the session's ``(DuplexFrame,
        events)`` (``events``: the engine's ``tick_overrun`` events of that tick). A row whose session left is
        free only after the next tick applies the leave: a join that finds the engine full while a leave is
        pending waits for it (at most :data:`LEAVE_WAIT_S`).

        Raises DuplexFull when every row is taken."""
        assert self.engine is not None
        q: asyncio.Queue = asyncio.Queue(OUTBOX_FRAMES)
        deadline = time.monotonic() + LEAVE_WAIT_S
        while True:
            with self._lock:
                try:
                    self.engine.join(session_id)
                    self._outboxes[session_id] = q
                    return q
                except ValueError as e:
                    if not self.engine.slots.leaving or time.monotonic() > deadline:
                        raise DuplexFull(str(e)) from None
            await asyncio.sleep(0.02)

    def leave(self, session_id: str) -> None:
        """Free the session's row before the next tick (idempotent)."""
        with self._lock:
            if self._outboxes.pop(session_id, None) is not None:
                self.engine.leave(session_id)

    def push(self, session_id: str, pcm: np.ndarray) -> None:
        """Queue one input frame: float32 ``[1920]`` at 24 kHz. Raises ValueError (see ``Slots.push``)."""
        self.engine.push(session_id, pcm)

    def stats(self) -> dict:
        """``sessions``, ``capacity``, ``ticks``, ``overrun_ticks``, ``late_ticks``, ``dropped_frames``."""
        e = self.engine
        return {
            "sessions": len(self._outboxes),
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
            if q.full():  # a client that does not read: keep the newest audio
                q.get_nowait()
                self.dropped_frames += 1
            q.put_nowait((f, events))
