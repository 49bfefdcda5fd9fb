"""The one frame clock of every surface: a 20 ms tick on the monotonic clock, re-anchored after a stall."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from omniduplex.app.core.audio.pcm import FRAME_MS

MAX_LAG_S = 0.060
"""A tick this late (a stalled event loop) re-anchors the clock instead of bursting to catch up (s)."""


class Pacer:
    """Frame ticks at ``period_s`` on ``clock``: frame ``n`` is due at ``anchor + n * period_s``.

    The first :meth:`wait` anchors the clock and returns at once; each later one sleeps until its frame is
    due, always yielding to the event loop (``sleep(0)`` when already late) so other tasks run between
    frames. A tick more than ``max_lag_s`` late re-anchors at the current time (counted in
    :attr:`reanchors`): the frames missed in a stall are skipped, not sent in a burst.

    Args:
        period_s: frame period (s); default 20 ms.
        clock: monotonic seconds (tests pass a fake clock).
        sleep: ``asyncio.sleep`` or a fake that advances the fake clock.
        max_lag_s: lateness that re-anchors (s).
    """

    def __init__(
        self,
        period_s: float = FRAME_MS / 1000.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        max_lag_s: float = MAX_LAG_S,
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"pacing period must be positive, got {period_s} s")
        self.period_s, self.clock, self.sleep, self.max_lag_s = period_s, clock, sleep, max_lag_s
        self.anchor: float | None = None
        self.n = 0  # frames since the anchor
        self.ticks = 0  # frames handed out in all
        self.reanchors = 0

    @property
    def due(self) -> float | None:
        """When the current frame was due (clock seconds); ``None`` before the first tick."""
        return None if self.anchor is None else self.anchor + self.n * self.period_s

    async def wait(self) -> float:
        """Wait until the next frame is due; returns its due time (clock seconds)."""
        now = self.clock()
        if self.anchor is None:
            self.anchor, self.n = now, 0
        else:
            due = self.anchor + (self.n + 1) * self.period_s
            if now - due > self.max_lag_s:
                self.anchor, self.n = now, 0
                self.reanchors += 1
            else:
                self.n += 1
            await self.sleep(max(0.0, due - now))
        self.ticks += 1
        return self.anchor + self.n * self.period_s

    async def run(self, tick: Callable[[float], object]) -> None:
        """Call ``tick(due)`` once per frame, forever (cancel the task to stop)."""
        while True:
            tick(await self.wait())
