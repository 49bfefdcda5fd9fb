"""A Twilio media stream on the duplex model (:class:`TwilioDuplexBridge`): the protocol of :mod:`.twilio`
(the same typed messages), the audio through :class:`~omniduplex.app.host.duplex_port.DuplexPort`.

Both directions flow every frame, with no VAD and no ``clear``: the caller's μ-law 8 kHz goes to Mimi's 24 kHz
(soxr) and into the engine every 80 ms; every 20 ms tick of the port's clock sends one 20 ms ``media`` message
of the model's audio resampled to 8 kHz (μ-law), silence included (the model's silence is part of its
speech), so Twilio's buffer holds what the model said up to now and nothing ahead of it. Barge-in is the
model's own business: it hears the caller while it speaks. A mark named ``duplex@<samples>`` follows every
``mark_ms`` of model audio; the echoed marks say how much the caller has heard (:attr:`heard`), and
:meth:`TwilioDuplexBridge.transcript` is the model's text up to there.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from omniduplex.app.host.duplex import DuplexService
from omniduplex.app.host.duplex_port import DuplexPort
from omniduplex.app.surfaces.phone.twilio import (
    TwilioStream,
    mark_message,
    media_message,
)
from omniduplex.app.surfaces.wire.g711 import TELEPHONE_RATE, ulaw_encode

log = logging.getLogger("omniduplex.phone.twilio")

MARK_PREFIX = "duplex@"


class TwilioDuplexBridge(TwilioStream):
    """One Twilio media stream ↔ one duplex engine row (the module docstring has the flow).

    Args:
        call_id: names the call and its engine row.
        service: the server's duplex model.
        send: sends one text frame to Twilio.
        mark_ms: model audio between marks (ms).

    :meth:`open` joins the engine (raises ``DuplexFull``); :meth:`handle` takes each inbound message.
    """

    kind = "duplex stream"

    def __init__(
        self,
        call_id: str,
        service: DuplexService,
        send: Callable[[str], Awaitable[None]],
        mark_ms: int = 100,
    ) -> None:
        self._init_stream(call_id, send)
        self.port = self.session = DuplexPort(service, call_id, TELEPHONE_RATE, TELEPHONE_RATE)
        self.mark_samples = TELEPHONE_RATE * mark_ms // 1000
        self.sent = self.marked = self.heard = 0  # model-audio samples (8 kHz)
        self.media_sent = 0

    async def open(self) -> None:
        """Join the engine. Raises DuplexFull when every row is taken."""
        await self.port.open()

    def _mark(self, name: str) -> None:
        if name.startswith(MARK_PREFIX) and name[len(MARK_PREFIX) :].isdigit():
            self.heard = max(self.heard, int(name[len(MARK_PREFIX) :]))
        else:
            self._error(f"mark {name!r} is not one of ours")

    # -- engine -> Twilio --------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        """One 20 ms frame of the model's audio (or of silence while the first frames come) to Twilio."""
        pcm, filled = self.port.pull()
        self.outbox.put_nowait(media_message(self.stream_sid, ulaw_encode(pcm)))
        self.media_sent += 1
        self.sent += filled
        if self.sent - self.marked >= self.mark_samples:
            self.marked = self.sent
            self.outbox.put_nowait(mark_message(self.stream_sid, f"{MARK_PREFIX}{self.sent}"))

    def transcript(self) -> str:
        """The model's text of the audio the caller has heard (per the echoed marks)."""
        return self.port.transcript(self.heard)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def close(self, reason: str) -> None:
        """Stop pacing and writing, free the engine row. Idempotent."""
        if self.closed:
            return
        self.closed = True
        await self.tasks.cancel()
        await self.port.close(reason)
        log.info("%s: duplex call closed (%s); %d bad messages", self.id, reason, self.errors)
