"""The duplex engine's clock: a thread that runs :meth:`~.engine.DuplexEngine.tick` once per 80 ms frame and
hands each tick's frames to a callback (a transport sends them). A tick that ends after the next one was due
starts the next at once (the clock never skips a frame: every session gets every frame, late) and is counted
in ``late_ticks``; the engine itself tells the sessions of the overrun (``tick_overrun`` events)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from omniduplex.pipeline.duplex.engine import FRAME_MS, DuplexEngine, DuplexFrame

log = logging.getLogger(__name__)


class DuplexClock:
    """Tick ``engine`` every ``period_ms`` on a daemon thread; ``on_frames(frames)`` gets each tick's frames.
    ``threads``: torch intra-op threads of the ticking thread (set on that thread only, so the rest of the
    process keeps its own; ``None`` leaves torch's default). One thread suits the CPU presets: their
    matmuls are too small to split, and a second OpenMP thread spins while it waits for a core
    (``omniduplex bench duplex --threads``).

    An exception in a tick or the callback is logged and the clock goes on (one bad tick drops nobody)."""

    def __init__(
        self,
        engine: DuplexEngine,
        on_frames: Callable[[list[DuplexFrame]], None],
        period_ms: float = FRAME_MS,
        threads: int | None = None,
    ) -> None:
        self.engine, self.on_frames, self.period_s = engine, on_frames, period_ms / 1000
        self.threads = threads
        self.late_ticks = self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start ticking (idempotent)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="duplex-clock", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the tick in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                frames = self.engine.tick()
                if frames:
                    self.on_frames(frames)
            except Exception:  # noqa: BLE001 - the clock serves every session; one failure must not stop it
                self.errors += 1
                log.exception("duplex tick failed")
            due += self.period_s
            wait = due - time.monotonic()
            if wait < 0:
                self.late_ticks += 1
                due = time.monotonic()
            else:
                self._stop.wait(wait)
