"""Twilio Media Streams (bidirectional, ``<Connect><Stream>``): typed events and the bridge to a Session.

Source: Twilio docs, "Media Streams - WebSocket Messages"
(twilio.com/docs/voice/media-streams/websocket-messages) and "TwiML Voice: <Stream>". One WebSocket
per call; every message is one JSON text frame.

Twilio → us, in this order:
    ``connected`` ``{protocol: "Call", version}`` once, first;
    ``start`` ``{streamSid, start: {streamSid, callSid, accountSid, tracks, mediaFormat: {encoding:
    "audio/x-mulaw", sampleRate: 8000, channels: 1}, customParameters}}`` once;
    ``media`` ``{media: {track: "inbound", chunk, timestamp (ms), payload: base64 μ-law}}`` every 20 ms
    (160 bytes), ``dtmf`` ``{dtmf: {track: "inbound_track", digit}}`` on a keypress, and ``mark``
    ``{mark: {name}}`` when the audio sent before our mark of that name has played — or was dropped by
    ``clear`` (Twilio then returns every pending mark at once);
    ``stop`` ``{stop: {accountSid, callSid}}`` last.
Us → Twilio: ``media`` ``{streamSid, media: {payload}}`` (μ-law 8 kHz, buffered and played in order),
``mark`` ``{streamSid, mark: {name}}``, ``clear`` ``{streamSid}`` (drop everything buffered).

Translation (:class:`TwilioBridge`): inbound μ-law → PCM → the session's
:class:`~omniduplex.app.core.audio.AudioPort` (8 → 16 kHz, 20 ms frames). Outbound pacing: the port's 20 ms
clock
pulls the session's playout, like every surface, but Twilio buffers what it receives, so reply frames may run
up to ``lead_ms`` ahead of the caller's ear (a little jitter tolerance; Twilio's buffer never holds more than
that) and idle (silent) frames are not sent at all. A mark named ``<turn_id>@<samples>`` follows every
``mark_ms`` of reply audio and the end of what was queued; the echoed marks are the playback position. On the
session's ``BargeIn`` the unsent frames are dropped and ``clear`` goes out at once; when the interrupted reply
ends, the session is told what the caller actually heard (the last mark echoed before the ``clear``) through
``Session.truncate``, so the history keeps the played part only. Once the session has handed out a reply's
last frame the reply is over for it, so speech in the last ``lead_ms`` of playback starts a new turn rather
than a barge-in. """

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from omniduplex.app.core.audio import AudioPort
from omniduplex.app.core.events import BargeIn, SessionEvent
from omniduplex.app.core.replies import Responder
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tasks import Tasks
from omniduplex.app.surfaces.wire.g711 import TELEPHONE_RATE, ulaw_decode, ulaw_encode

log = logging.getLogger("omniduplex.phone.twilio")

MEDIA_ENCODING = "audio/x-mulaw"
"""The only ``start.mediaFormat.encoding`` of bidirectional streams."""


class ProtocolError(ValueError):
    """A message that is not valid Twilio Media Streams JSON; the message says why."""


class _Msg(BaseModel):
    model_config = {"extra": "ignore"}


class Connected(_Msg):
    event: Literal["connected"]
    protocol: str = "Call"
    version: str = ""


class MediaFormat(_Msg):
    encoding: str
    sampleRate: int  # noqa: N815 (Twilio's field names)
    channels: int = 1


class StartInfo(_Msg):
    streamSid: str = ""  # noqa: N815
    callSid: str = ""  # noqa: N815
    accountSid: str = ""  # noqa: N815
    tracks: list[str] = Field(default_factory=list)
    mediaFormat: MediaFormat  # noqa: N815
    customParameters: dict[str, str] = Field(default_factory=dict)  # noqa: N815


class Start(_Msg):
    event: Literal["start"]
    streamSid: str  # noqa: N815
    start: StartInfo


class MediaChunk(_Msg):
    track: str = "inbound"
    chunk: str | None = None
    timestamp: str | None = None
    payload: str


class Media(_Msg):
    event: Literal["media"]
    streamSid: str = ""  # noqa: N815
    media: MediaChunk


class DtmfDigit(_Msg):
    track: str = "inbound_track"
    digit: str


class Dtmf(_Msg):
    event: Literal["dtmf"]
    streamSid: str = ""  # noqa: N815
    dtmf: DtmfDigit


class MarkName(_Msg):
    name: str


class Mark(_Msg):
    event: Literal["mark"]
    streamSid: str = ""  # noqa: N815
    mark: MarkName


class Stop(_Msg):
    event: Literal["stop"]
    streamSid: str = ""  # noqa: N815


InboundEvent = Annotated[Connected | Start | Media | Dtmf | Mark | Stop, Field(discriminator="event")]
_inbound = TypeAdapter(InboundEvent)


def parse_inbound(text: str | bytes) -> Connected | Start | Media | Dtmf | Mark | Stop:
    """One Twilio → us message as its typed event.

    Raises:
        ProtocolError: not JSON, not an object, an unknown ``event``, or a missing/ill-typed field.
    """
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
        raise ProtocolError("not a JSON object with an 'event' string")
    try:
        return _inbound.validate_python(obj)
    except ValidationError as e:
        first = e.errors()[0]
        raise ProtocolError(f"bad {obj['event']!r} message: {first['msg']} at {first['loc']}") from None


def media_message(stream_sid: str, ulaw: bytes) -> str:
    """Us → Twilio ``media``: ``ulaw`` is μ-law 8 kHz mono bytes (one byte per sample)."""
    payload = base64.b64encode(ulaw).decode("ascii")
    return json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": payload}})


def mark_message(stream_sid: str, name: str) -> str:
    """Us → Twilio ``mark``: echoed back when the audio sent before it has played (or was cleared)."""
    return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear_message(stream_sid: str) -> str:
    """Us → Twilio ``clear``: Twilio drops the audio it has buffered and returns the pending marks."""
    return json.dumps({"event": "clear", "streamSid": stream_sid})


def _mark_name(turn_id: str, samples: int) -> str:
    return f"{turn_id}@{samples}"


def _parse_mark(name: str) -> tuple[str, int] | None:
    turn_id, sep, samples = name.rpartition("@")
    return (turn_id, int(samples)) if sep and samples.isdigit() else None


class TwilioStream:
    """What both Twilio bridges share: the inbound messages (:meth:`handle`), the ``start`` checks, the
    caller's μ-law into ``self.port`` (an object with ``push(pcm)`` and ``run(tick)``: the cascade's
    :class:`~omniduplex.app.core.audio.AudioPort` or the duplex model's port), and the writer task that sends
    :attr:`outbox` in order. A bridge sets ``self.port`` and implements ``_mark(name)`` (an echoed mark) and
    ``_tick(now)`` (the port's 20 ms clock); ``_sent(text)`` runs after each frame handed to the socket."""

    kind = "stream"
    """Names the bridge in its log lines."""

    def _init_stream(self, call_id: str, send: Callable[[str], Awaitable[None]]) -> None:
        self.id, self.send = call_id, send
        self.stream_sid: str | None = None
        self.call_sid = ""
        self.parameters: dict[str, str] = {}
        self.digits: list[str] = []
        self.errors = 0
        self.outbox: asyncio.Queue[str] = asyncio.Queue()
        self.tasks = Tasks(call_id)
        self.closed = False

    # -- Twilio → us -------------------------------------------------------------------------------
    def handle(self, text: str | bytes) -> bool:
        """Process one inbound message; ``False`` once the stream has ended (``stop`` or a fatal error).

        Bad messages (garbage, unknown events, ``media`` before ``start``) are logged and skipped.
        """
        try:
            ev = parse_inbound(text)
        except ProtocolError as e:
            return self._error(str(e))
        if isinstance(ev, Media):
            return self._media(ev)
        if isinstance(ev, Mark):
            self._mark(ev.mark.name)
        elif isinstance(ev, Dtmf):
            self.digits.append(ev.dtmf.digit)
            log.info("%s: DTMF %s", self.id, ev.dtmf.digit)
        elif isinstance(ev, Start):
            return self._start(ev)
        elif isinstance(ev, Stop):
            log.info("%s: stream stopped by Twilio", self.id)
            return False
        else:
            log.info("%s: connected (protocol %s %s)", self.id, ev.protocol, ev.version)
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
        log.info(
            "%s: %s %s of call %s started %s",
            self.id, self.kind, self.stream_sid, self.call_sid, self.parameters,
        )
        self.tasks.spawn(self.port.run(self._tick), "pace")
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

    def _mark(self, name: str) -> None:
        raise NotImplementedError

    def _tick(self, now: float) -> None:
        raise NotImplementedError

    # -- us → Twilio -------------------------------------------------------------------------------
    async def _write(self) -> None:
        while True:
            text = await self.outbox.get()
            try:
                await self.send(text)
            except Exception as e:  # the socket went away; the receive loop ends the call
                log.info("%s: send failed (%s); writer stopped", self.id, e)
                return
            self._sent(text)

    def _sent(self, text: str) -> None:
        """After ``text`` went to the socket (nothing by default)."""


class TwilioBridge(TwilioStream):
    """One Twilio media stream ↔ one :class:`Session` (the module docstring has the protocol and pacing).

    Args:
        call_id: names the session.
        responder: where replies come from.
        cfg: session settings; ``output_rate`` is forced to 8000 Hz (the session's playout resamples the
            responder's audio to the wire rate with its soxr stream).
        send: sends one text frame to Twilio.
        lead_ms: reply audio sent ahead of the caller's ear, at most (ms).
        mark_ms: reply audio between marks (ms).
        turn_model: the server's shared end-of-turn model (``turn_detection="smart"``), else ``None``.
        tool_runner: runs the replies' calls on the server (MCP tools, :mod:`omniduplex.app.host.tools`).
    """

    def __init__(
        self,
        call_id: str,
        responder: Responder,
        cfg: SessionConfig,
        send: Callable[[str], Awaitable[None]],
        lead_ms: int = 100,
        mark_ms: int = 100,
        clock: Callable[[], float] = time.monotonic,
        turn_model=None,
        tool_runner=None,
    ) -> None:
        self._init_stream(call_id, send)
        self.clock = clock
        self.lead_s = lead_ms / 1000.0
        cfg.output_rate = TELEPHONE_RATE
        self.session = Session(
            call_id, responder, self._on_event, cfg, clock=clock,
            turn_model=turn_model, tool_runner=tool_runner
        )
        self.port = AudioPort(self.session, TELEPHONE_RATE, clock=clock)
        self.mark_samples = max(self.port.out_frame, TELEPHONE_RATE * mark_ms // 1000)
        self.ear = float("-inf")  # when the caller will have heard everything sent so far (clock s)
        self.sent: dict[str, int] = {}  # reply samples sent per turn
        self.marked: dict[str, int] = {}  # ... up to the last mark sent
        self.heard: dict[str, int] = {}  # ... up to the last mark echoed (what the caller heard)
        self.barge_in_at: float | None = None
        self.clear_ms: list[float] = []  # BargeIn event → clear handed to the socket (ms)

    def _mark(self, name: str) -> None:
        parsed = _parse_mark(name)
        if parsed is None:
            self._error(f"mark {name!r} is not one of ours")
            return
        turn_id, samples = parsed
        self.heard[turn_id] = max(self.heard.get(turn_id, 0), samples)

    # -- session → Twilio --------------------------------------------------------------------------
    def _on_event(self, ev: SessionEvent) -> None:
        if isinstance(ev, BargeIn):
            heard = self.heard.get(ev.turn_id, 0)  # what the caller had heard: the session truncates to it
            asyncio.get_running_loop().call_soon(self._truncate, ev.turn_id, heard)
            self.barge_in_at = self.clock()
            while not self.outbox.empty():  # unsent reply audio and marks: never needed now
                self.outbox.get_nowait()
            if self.stream_sid is not None:
                self.outbox.put_nowait(clear_message(self.stream_sid))
        log.debug("%s: %s", self.id, ev.to_json())

    def _truncate(self, turn_id: str, heard: int) -> None:
        try:
            kept = self.session.truncate(turn_id, 1000.0 * heard / TELEPHONE_RATE)
        except ValueError as e:
            log.warning("%s: could not truncate %s: %s", self.id, turn_id, e)
            return
        log.info("%s: %s heard %.0f ms of the reply; history keeps %r", self.id, turn_id, heard / 8, kept)

    def _tick(self, now: float) -> None:
        """One tick of the port's 20 ms clock: send reply frames until ``lead_s`` is buffered at Twilio."""
        s, port = self.session, self.port
        if port.queued == 0:
            port.pull()  # idle, the stop frame after a barge-in, or the reply's end
            return
        while port.queued > 0 and self.ear - now < self.lead_s and s.reply_turn_id is not None:
            turn_id = s.reply_turn_id
            pcm, filled = port.pull()
            self.ear = max(self.ear, now) + port.pacer.period_s
            self._send_reply_frame(turn_id, pcm, filled)

    def _send_reply_frame(self, turn_id: str, pcm, filled: int) -> None:
        sid = self.stream_sid
        self.outbox.put_nowait(media_message(sid, ulaw_encode(pcm)))
        sent = self.sent[turn_id] = self.sent.get(turn_id, 0) + filled
        if sent - self.marked.get(turn_id, 0) >= self.mark_samples or self.port.queued == 0:
            self.marked[turn_id] = sent
            self.outbox.put_nowait(mark_message(sid, _mark_name(turn_id, sent)))

    def _sent(self, text: str) -> None:
        if self.barge_in_at is not None and text.startswith('{"event": "clear"'):
            ms = 1000.0 * (self.clock() - self.barge_in_at)
            self.clear_ms.append(ms)
            self.barge_in_at = None
            log.info("%s: clear sent %.1f ms after barge-in detection", self.id, ms)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def close(self, reason: str) -> None:
        """Stop pacing and writing, close the session (cancels the reply in flight). Idempotent."""
        if self.closed:
            return
        self.closed = True
        await self.tasks.cancel()
        await self.session.close(reason)
        log.info("%s: closed (%s); %d bad messages", self.id, reason, self.errors)
