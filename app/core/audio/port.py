"""A session's audio port: wire PCM in → session frames; session output → wire frames, on one clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np

from omniduplex.app.core.audio.pacer import Pacer
from omniduplex.app.core.audio.pcm import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, frame_samples, mono, to_int16
from omniduplex.app.core.audio.resample import Reframer, StreamResampler

if TYPE_CHECKING:
    from omniduplex.app.core.session import Session


class AudioPort:
    """Everything between a surface's codec and its :class:`~omniduplex.app.core.session.Session`.

    Input: :meth:`push` takes decoded wire PCM (int16 or float in [-1, 1], any chunk length, any rate and
    channel count) and feeds the session whole 20 ms, 16 kHz mono int16 frames (320 samples) through one
    streaming resampler and one reframer. Output: :meth:`pull` returns the next 20 ms frame of the session's
    output (int16 mono at ``session.cfg.output_rate``) and how much of it is reply audio; :attr:`pacer` is
    the frame clock the surface pulls on (:meth:`run` for a loop, ``await port.pacer.wait()`` when the
    wire library asks for frames, as aiortc does).

    Args:
        session: the session fed and pulled.
        in_rate: the wire's input rate (Hz); :meth:`push` may name another (a new resampler stream).
        clock, sleep: the pacer's clock and sleep (default: monotonic time, ``asyncio.sleep``).
    """

    def __init__(
        self,
        session: Session,
        in_rate: int = SAMPLE_RATE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.session = session
        self.out_rate = session.cfg.output_rate
        self.out_frame = frame_samples(self.out_rate)
        self.resampler = StreamResampler(in_rate, SAMPLE_RATE)
        self.reframer = Reframer(FRAME_SAMPLES)
        self.pacer = Pacer(FRAME_MS / 1000.0, clock, sleep)

    # -- wire → session --------------------------------------------------------------------------------
    def resample(self, pcm: np.ndarray, rate: int | None = None, channels: int = 1) -> np.ndarray:
        """Interleaved wire PCM at ``rate`` Hz (default: the current input rate) → the int16 samples at
        16 kHz mono it completes (streaming: state carries over to the next call)."""
        return to_int16(self.resampler.process(mono(pcm, channels), rate))

    def frames(self, pcm16k: np.ndarray) -> list[np.ndarray]:
        """16 kHz int16 samples → the whole 320-sample frames they complete (the rest waits)."""
        return self.reframer.push(pcm16k)

    def feed(self, pcm16k: np.ndarray) -> int:
        """16 kHz int16 samples → the session, frame by frame; returns frames pushed."""
        frames = self.frames(pcm16k)
        for f in frames:
            self.session.push_audio(f)
        return len(frames)

    def push(self, pcm: np.ndarray, rate: int | None = None, channels: int = 1) -> int:
        """Wire PCM → the session (:meth:`resample` then :meth:`feed`); returns frames pushed."""
        return self.feed(self.resample(pcm, rate, channels))

    # -- session → wire --------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        """Reply audio waiting in the session (samples at the output rate)."""
        return self.session.queued_samples

    def pull(
        self, n: int | None = None, deliver: Callable[[np.ndarray, int], None] | None = None
    ) -> tuple[np.ndarray, int]:
        """The next ``n`` output samples (default one 20 ms frame; int16, zero-padded) and how many of them
        are reply audio; ``deliver(pcm, filled)``, if given, is called with them before the events that pull
        caused are dispatched (:meth:`Session.pull_audio`)."""
        n = self.out_frame if n is None else n
        return self.session.pull_audio(n, deliver)

    async def run(self, tick: Callable[[float], object]) -> None:
        """The surface's frame loop: ``tick(due)`` every 20 ms on :attr:`pacer` (cancel to stop)."""
        await self.pacer.run(tick)
