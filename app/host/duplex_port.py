"""The one adapter from a surface's audio port to a duplex session (:class:`DuplexPort`): the browser
(WebRTC, 48 kHz), the kiosk (the same) and the phone (Twilio, SIP: 8 kHz G.711 decoded to PCM) run the duplex
model (:mod:`.duplex`) through it instead of the cascade's :class:`~omniduplex.app.core.session.Session`.

It has the surface-facing half of :class:`~omniduplex.app.core.audio.AudioPort`: :meth:`DuplexPort.push`
takes decoded wire PCM (any rate, chunk length, channel count), :meth:`DuplexPort.pull` hands back the next
20 ms frame at the wire rate, :attr:`DuplexPort.pacer` is the 20 ms clock a surface pulls on. What differs is
behind it: no VAD, no turns, no barge-in logic (the model hears and speaks at every 80 ms frame, barge-in is
its own business). Input is resampled to Mimi's 24 kHz with one soxr stream and cut into 80 ms frames (1920
samples) pushed to the engine; each 80 ms output frame of the engine is resampled to the wire rate with
another soxr stream and queued for :meth:`~DuplexPort.pull`.

Playout: the engine delivers 80 ms at a time while the wire pulls 20 ms, so playback starts once
:data:`PREBUFFER_MS` is queued (one engine frame plus a pull of slack) and starts over the same way after
running dry (counted in ``output_underruns``); more than :data:`MAX_QUEUED_MS` queued (a stalled wire) drops
the oldest audio (``output_dropped_ms``). The port is also the host's session record of the call
(``id``, ``stats``, ``busy``, ``close``), so a surface puts it where a cascade call has its ``Session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import numpy as np

from omniduplex.app.core.audio import Pacer, Reframer, StreamResampler, to_int16
from omniduplex.app.core.audio.pcm import mono
from omniduplex.app.core.session_config import SessionStats
from omniduplex.app.host.duplex import DuplexService
from omniduplex.models.moshi.config import FRAME_SAMPLES, SAMPLE_RATE

log = logging.getLogger("omniduplex.duplex.port")

PULL_MS = 20
"""The wire frame every surface pulls (ms)."""
PREBUFFER_MS = 100
"""Output queued before playback (re)starts: one 80 ms engine frame plus a 20 ms pull of slack."""
MAX_QUEUED_MS = 400
"""Output queued beyond this (a wire that stopped pulling) drops the oldest audio."""


class DuplexPort:
    """One surface call on the duplex engine.

    Args:
        service: the server's duplex model (``ServerState.duplex``).
        session_id: the engine row's session id (the call id).
        in_rate: the wire's input rate (Hz; 48000 WebRTC, 8000 phone).
        out_rate: the wire's output rate (Hz).
        on_text: called on the event loop with each text piece of the model's inner monologue (its text
            token id and a space: the ``init-model`` presets have no tokenizer), after the frame it belongs to
            was queued for playout.
        on_event: called with each engine event of the session (``{"type": "tick_overrun", ...}``).
    """

    busy = False
    """For the drain (:mod:`.drain`): a duplex call has no reply in flight to finish."""

    def __init__(
        self,
        service: DuplexService,
        session_id: str,
        in_rate: int,
        out_rate: int,
        on_text: Callable[[str], None] | None = None,
        on_event: Callable[[dict], None] | None = None,
    ) -> None:
        self.service, self.id = service, session_id
        self.in_rate, self.out_rate = in_rate, out_rate
        self.out_frame = out_rate * PULL_MS // 1000
        self.on_text, self.on_event = on_text, on_event
        self.stats = SessionStats()
        self.pacer = Pacer(PULL_MS / 1000.0)
        self._in = StreamResampler(in_rate, SAMPLE_RATE)
        self._frames = Reframer(FRAME_SAMPLES)
        self._out = StreamResampler(SAMPLE_RATE, out_rate)
        self._queue = np.zeros(0, np.int16)
        self._playing = False
        self._prebuffer = out_rate * PREBUFFER_MS // 1000
        self._max_queued = out_rate * MAX_QUEUED_MS // 1000
        self._task: asyncio.Task | None = None
        self.closed = False
        self.frames_in = self.frames_out = self.input_dropped = 0
        self.output_underruns = self.output_dropped_ms = 0
        self.played_samples = 0
        """Output samples handed to the wire since the call started (at ``out_rate``)."""
        self.history: list[tuple[int, str]] = []
        """``(end, text)``: each text piece and where its frame ends in the output stream (samples at
        ``out_rate``), for a surface that learns what was played (Twilio marks)."""
        self._queued_total = 0

    async def open(self) -> None:
        """Join the engine from its next tick on and start receiving its frames.

        Raises:
            DuplexFull: every engine row is taken (:meth:`DuplexService.join`).
        """
        outbox = await self.service.join(self.id)
        self._task = asyncio.create_task(self._receive(outbox), name=f"duplex-port-{self.id}")

    async def close(self, reason: str) -> None:
        """Leave the engine (the row is free before the next tick) and stop receiving. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.service.leave(self.id)
        log.info(
            "duplex call %s closed (%s): %d frames in, %d out, %d output underruns",
            self.id, reason, self.frames_in, self.frames_out, self.output_underruns,
        )

    # -- wire -> engine ----------------------------------------------------------------------------
    def push(self, pcm: np.ndarray, rate: int | None = None, channels: int = 1) -> int:
        """Interleaved wire PCM (int16, or float in [-1, 1]) at ``rate`` Hz (default ``in_rate``) → the
        engine's 80 ms 24 kHz frames it completes; returns frames pushed. A frame the engine refuses (its
        queue holds 2 s already: the wire runs ahead of real time) is dropped and counted
        (``input_dropped``); nothing is raised to the wire's receive loop."""
        if self.closed:
            return 0
        x = self._in.process(mono(pcm, channels), rate)
        pushed = 0
        for frame in self._frames.push(x):
            try:
                self.service.push(self.id, frame)
                pushed += 1
            except ValueError as e:
                self.input_dropped += 1
                log.debug("duplex call %s: input frame dropped: %s", self.id, e)
        self.frames_in += pushed
        return pushed

    # -- engine -> wire ----------------------------------------------------------------------------
    async def _receive(self, outbox: asyncio.Queue) -> None:
        while True:
            frame, events = await outbox.get()
            for e in events:
                if self.on_event is not None:
                    self.on_event(e)
            out = to_int16(self._out.process(frame.pcm))
            self._queue = np.concatenate([self._queue, out])
            self._queued_total += out.size
            self.frames_out += 1
            over = self._queue.size - self._max_queued
            if over > 0:
                self._queue = self._queue[over:]
                self.output_dropped_ms += 1000 * over // self.out_rate
            tok = frame.text_token
            if tok is not None and tok not in self.service.pad_ids:
                text = f"{tok} "
                self.history.append((self._queued_total, text))
                if self.on_text is not None:
                    self.on_text(text)

    @property
    def queued(self) -> int:
        """Model audio waiting for the wire (samples at ``out_rate``)."""
        return int(self._queue.size)

    def pull(self, n: int | None = None, deliver=None) -> tuple[np.ndarray, int]:
        """The next ``n`` output samples (default one 20 ms frame; int16 at ``out_rate``, zero-padded) and
        how many of them are model audio; ``deliver(pcm, filled)``, if given, is called with them."""
        n = self.out_frame if n is None else n
        if not self._playing and self._queue.size >= self._prebuffer:
            self._playing = True
        out = np.zeros(n, np.int16)
        filled = 0
        if self._playing:
            filled = min(n, self._queue.size)
            out[:filled] = self._queue[:filled]
            self._queue = self._queue[filled:]
            if filled < n:  # ran dry: queue a prebuffer again before playing on
                self._playing = False
                self.output_underruns += 1
        self.played_samples += n
        if deliver is not None:
            deliver(out, filled)
        return out, filled

    async def run(self, tick) -> None:
        """The surface's frame loop: ``tick(due)`` every 20 ms on :attr:`pacer` (cancel to stop)."""
        await self.pacer.run(tick)

    def transcript(self, played: int) -> str:
        """The text of the frames whose audio ends at or before output sample ``played`` (at ``out_rate``)."""
        return "".join(t for end, t in self.history if end <= played)
