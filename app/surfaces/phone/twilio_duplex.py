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

import asyncio
import base64
import binascii
import logging
from collections.abc import Awaitable, Callable

from omniduplex.app.core.tasks import Tasks
from omniduplex.app.host.duplex import DuplexService
from omniduplex.app.host.duplex_port import DuplexPort
from omniduplex.app.surfaces.phone.twilio import (
    MEDIA_ENCODING,
    Dtmf,
    Mark,
    Media,
    ProtocolError,
    Start,
    Stop,
    mark_message,
    media_message,
    parse_inbound,
)
from omniduplex.app.surfaces.wire.g711 import TELEPHONE_RATE, ulaw_decode, ulaw_encode

log = logging.getLogger("omniduplex.phone.twilio")

MARK_PREFIX = "duplex@"


class TwilioDuplexBridge:
    """One Twilio media stream ↔ one duplex engine row (the module docstring has the flow).

    Args:
        call_id: names the call and its engine row.
        service: the server's duplex model.
        send: sends one text frame to Twilio.
        mark_ms: model audio between marks (ms).

    :meth:`open` joins the engine (raises ``DuplexFull``); :meth:`handle` takes each inbound message.
    """

    def __init__(
        self,
        call_id: str,
        service: DuplexService,
        send: Callable[[str], Awaitable[None]],
        mark_ms: int = 100,
    ) -> None:
        self.id, self.send = call_id, send
        self.port = self.session = DuplexPort(service, call_id, TELEPHONE_RATE, TELEPHONE_RATE)
        self.mark_samples = TELEPHONE_RATE * mark_ms // 1000
        self.stream_sid: str | None = None
        self.call_sid = ""
        self.parameters: dict[str, str] = {}
        self.digits: list[str] = []
        self.errors = 0
        self.outbox: asyncio.Queue[str] = asyncio.Queue()
        self.sent = self.marked = self.heard = 0  # model-audio samples (8 kHz)
        self.media_sent = 0
        self.tasks = Tasks(call_id)
        self.closed = False

    async def open(self) -> None:
        """Join the engine. Raises DuplexFull when every row is taken."""
        await self.port.open()

    # -- Twilio -> engine --------------------------------------------------------------------------
    def handle(self, text: str | bytes) -> bool:
        """Process one inbound message; ``False`` once the stream has ended (``stop`` or a bad format).
        Bad messages are logged, counted and skipped."""
        try:
            ev = parse_inbound(text)
        except ProtocolError as e:
            return self._error(str(e))
        if isinstance(ev, Media):
            return self._media(ev)
        if isinstance(ev, Mark):
            name = ev.mark.name
            if name.startswith(MARK_PREFIX) and name[len(MARK_PREFIX) :].isdigit():
                self.heard = max(self.heard, int(name[len(MARK_PREFIX) :]))
            else:
                self._error(f"mark {name!r} is not one of ours")
        elif isinstance(ev, Dtmf):
            self.digits.append(ev.dtmf.digit)
        elif isinstance(ev, Start):
            return self._start(ev)
        elif isinstance(ev, Stop):
            log.info("%s: stream stopped by Twilio", self.id)
            return False
        return True

    def _start(self, ev: Start) -> bool:
        if self.stream_sid is not None:
            return self._error("a second 'start' on this stream")
        fmt = ev.start.mediaFormat
        if (fmt.encoding, fmt.sampleRate, fmt.channels) != (MEDIA_ENCODING, TELEPHONE_RATE, 1):
            self._error(f"unsupported media format {fmt.encoding}/{fmt.sampleRate}/{fmt.channels}")
            return False
        self.stream_sid = ev.start.streamSid or ev.streamSid
        self.call_sid, self.parameters = ev.start.callSid, dict(ev.start.customParameters)
        log.info("%s: duplex stream %s of call %s started", self.id, self.stream_sid, self.call_sid)
        self.tasks.spawn(self.port.pacer.run(self._tick), "pace")
        self.tasks.spawn(self._write(), "write")
        return True

    def _media(self, ev: Media) -> bool:
        if self.stream_sid is None:
            return self._error("'media' before 'start'")
        if ev.media.track not in ("inbound", "inbound_track"):
            return True
        try:
            ulaw = base64.b64decode(ev.media.payload, validate=True)
        except (binascii.Error, ValueError):
            return self._error("'media' payload is not base64")
        self.port.push(ulaw_decode(ulaw))
        return True

    def _error(self, message: str) -> bool:
        self.errors += 1
        log.warning("%s: ignored a bad message: %s", self.id, message)
        return True

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

    async def _write(self) -> None:
        while True:
            text = await self.outbox.get()
            try:
                await self.send(text)
            except Exception as e:  # the socket went away; the receive loop ends the call
                log.info("%s: send failed (%s); writer stopped", self.id, e)
                return

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
