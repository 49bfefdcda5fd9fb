"""The WebRTC transport: one aiortc peer connection adapted to one
:class:`~omniduplex.app.core.session.Session`.

* Inbound: the browser's Opus track (decoded by aiortc to 48 kHz) → the session's
  :class:`~omniduplex.app.core.audio.AudioPort` (mono, 16 kHz, 20 ms frames).
* Outbound: :class:`SessionAudioTrack` pulls one 20 ms, 48 kHz frame from the port when its pacer says
  it is due on the wire (real-time pacing, nothing buffered ahead), aiortc encodes it as Opus.
* A data channel (opened by the client) carries the session's events as JSON, one per message.
  The client may send ``{"type": "bye"}`` (hang up) and ``{"type": "greet"}`` (the kiosk: have the
  assistant welcome a visitor, :func:`~omniduplex.app.core.greeting.speak_greeting`).
* The session is closed when the connection fails or closes, when the client says ``bye``, or when
  no inbound audio arrives for ``media_timeout_s`` (a client that vanished without a goodbye).
* Duplex (``duplex`` given): the peer runs the duplex model instead of the cascade, through
  :class:`~omniduplex.app.host.duplex_port.DuplexPort` in place of the session and its port (48 kHz both ways,
  no VAD, no turns); the data channel carries ``{"type": "session_started", "duplex": true}``, the model's
  text as ``{"type": "duplex_text", "text"}`` and ``{"type": "duplex_tick_overrun", ...}``; ``greet`` is
  ignored (the model decides when to speak).
"""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import time
from collections.abc import Awaitable, Callable

import av
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from omniduplex.app.core.audio import AudioPort
from omniduplex.app.core.events import SessionEvent
from omniduplex.app.core.greeting import speak_greeting
from omniduplex.app.core.replies import Responder
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tasks import Tasks
from omniduplex.app.host.duplex import DuplexService
from omniduplex.app.host.duplex_port import DuplexPort

log = logging.getLogger("omniduplex.webrtc")

WIRE_RATE = 48000
"""Opus clock rate both ways (Hz; RFC 7587 §4.1)."""


class OfferError(ValueError):
    """The client's offer cannot be answered; the message says why (HTTP 400)."""


def check_offer(sdp: object, kind: object) -> str:
    """Cheap structural checks before aiortc parses the SDP; returns the SDP or raises :class:`OfferError`."""
    if kind != "offer":
        raise OfferError(f"'type' must be 'offer', got {kind!r}")
    if not isinstance(sdp, str) or not sdp.strip():
        raise OfferError("'sdp' must be a non-empty string")
    lines = [ln.strip() for ln in sdp.strip().splitlines()]
    if lines[0] != "v=0":
        raise OfferError("SDP must start with 'v=0'")
    if not any(ln.startswith("m=audio ") for ln in lines):
        raise OfferError("SDP offers no audio (no 'm=audio' line)")
    if not any(ln.startswith("a=fingerprint:") for ln in lines):
        raise OfferError("SDP has no DTLS fingerprint ('a=fingerprint:')")
    if not any(ln.startswith("a=ice-ufrag:") for ln in lines):
        raise OfferError("SDP has no ICE credentials ('a=ice-ufrag:')")
    if "opus/48000" not in sdp.lower():
        raise OfferError("SDP offers no Opus/48000 audio codec")
    return sdp


class SessionAudioTrack(MediaStreamTrack):
    """Outbound audio: 20 ms, 48 kHz mono s16 frames pulled from the port when its pacer says they are due."""

    kind = "audio"

    def __init__(self, port: AudioPort | DuplexPort) -> None:
        super().__init__()
        self.port = port
        self.pts = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self.port.pacer.wait()
        pcm, _ = self.port.pull()
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = WIRE_RATE
        frame.pts = self.pts
        frame.time_base = fractions.Fraction(1, WIRE_RATE)
        self.pts += pcm.size
        return frame


class PeerSession:
    """One client: an aiortc peer connection, its :class:`Session`, the event data channel.

    Args:
        session_id: the session's name.
        responder: where replies come from.
        cfg: session settings (``output_rate`` is forced to the wire rate).
        on_closed: awaited once when the peer is fully closed (the server frees its slot there).
        media_timeout_s: close when no inbound audio arrives for this long after the first frame.
        connect_timeout_s: close when no inbound audio arrives this long after the answer.
        turn_model: the shared end-of-turn model for ``turn_detection="smart"`` (see :class:`Session`).
        greeting: what a ``{"type": "greet"}`` message has the assistant say.
        tool_runner: runs the replies' calls on the server (MCP tools, :mod:`omniduplex.app.host.tools`).
        duplex: run this duplex model instead of the cascade (see the module docstring); :meth:`answer`
            then raises ``DuplexFull`` when every engine row is taken.
    """

    def __init__(
        self,
        session_id: str,
        responder: Responder,
        cfg: SessionConfig,
        on_closed: Callable[[PeerSession], Awaitable[None]],
        media_timeout_s: float = 5.0,
        connect_timeout_s: float = 20.0,
        turn_model=None,
        greeting: str = "Hello! How can I help?",
        tool_runner=None,
        duplex: DuplexService | None = None,
    ) -> None:
        self.id, self.on_closed = session_id, on_closed
        self.media_timeout_s, self.connect_timeout_s = media_timeout_s, connect_timeout_s
        cfg.output_rate = WIRE_RATE
        self.pc = RTCPeerConnection()
        self.channel = None
        self.pending: list[str] = []  # events emitted before the data channel opened
        self.duplex: DuplexPort | None = None
        if duplex is not None:
            self.session = self.port = self.duplex = DuplexPort(
                duplex, session_id, WIRE_RATE, WIRE_RATE, self._send_text, self._send_overrun
            )
        else:
            self.session = Session(
                session_id, responder, self._send_event, cfg, turn_model=turn_model, tool_runner=tool_runner
            )
            self.port = AudioPort(self.session, WIRE_RATE)
        self.out_track = SessionAudioTrack(self.port)
        self.tasks = Tasks(session_id)
        self.last_media = time.monotonic()
        self.got_media = False
        self.closing = False
        self.done = asyncio.Event()
        self.inbound_frames = 0
        self.greeting = greeting

    async def answer(self, sdp: str) -> str:
        """Apply the client's offer and return the answer SDP (ICE candidates included).

        Raises:
            OfferError: aiortc rejected the SDP (the peer is closed again).
            DuplexFull: a duplex peer found every engine row taken (the peer is closed again).
        """
        if self.duplex is not None:
            try:
                await self.duplex.open()  # before any negotiation
            except Exception:
                await self.close("duplex engine full")
                raise
            self._send_json({"type": "session_started", "session_id": self.id, "duplex": True})
        pc = self.pc
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_state)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
            if not audio:
                raise OfferError("SDP offers no audio transceiver")
            opus = [
                c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"
            ]
            audio[0].setCodecPreferences(opus)
            pc.addTrack(self.out_track)
            await pc.setLocalDescription(await pc.createAnswer())
        except OfferError:
            await self.close("bad offer")
            raise
        except Exception as e:  # aiortc's parser and negotiation errors
            await self.close("bad offer")
            raise OfferError(f"cannot negotiate this offer: {e}") from e
        self._spawn(self._watchdog(), "watchdog")
        return pc.localDescription.sdp

    async def close(self, reason: str) -> None:
        """Cancel the reply in flight, stop media, close the connection, then ``on_closed``. Idempotent."""
        if self.closing:
            await self.done.wait()
            return
        self.closing = True
        log.info("session %s closing: %s", self.id, reason)
        try:
            await self.session.close(reason)
            self.out_track.stop()
            await self.tasks.cancel()
            await self.pc.close()
        finally:
            self.done.set()
            await self.on_closed(self)

    # -- aiortc callbacks --------------------------------------------------------------------------
    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._inbound(track), "inbound")

    def _on_datachannel(self, channel) -> None:
        self.channel = channel
        channel.on("message", self._on_message)
        if channel.readyState == "open":
            self._flush_pending()
        else:
            channel.on("open", self._flush_pending)

    def _on_message(self, message) -> None:
        try:
            msg = json.loads(message) if isinstance(message, str) else {}
        except ValueError:
            return
        if isinstance(msg, dict) and msg.get("type") == "bye":
            self._spawn(self.close("client said bye"), "close")
        elif isinstance(msg, dict) and msg.get("type") == "greet" and not self.closing and not self.duplex:
            speak_greeting(self.session, self.greeting)  # the kiosk: a visitor walked up and tapped

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        log.info("session %s connection %s", self.id, state)
        if state in ("failed", "closed") and not self.closing:
            self._spawn(self.close(f"connection {state}"), "close")

    # -- loops -------------------------------------------------------------------------------------
    async def _inbound(self, track: MediaStreamTrack) -> None:
        """Decoded Opus frames (aiortc: packed s16, 48 kHz, 1 or 2 channels) into the port."""
        try:
            while True:
                frame = await track.recv()
                self.last_media, self.got_media = time.monotonic(), True
                self.inbound_frames += 1
                pcm = frame.to_ndarray()  # packed: (1, samples × channels); planar: (channels, samples)
                pcm = pcm.T.reshape(-1) if frame.format.is_planar else pcm.reshape(-1)
                self.port.push(pcm, frame.sample_rate, len(frame.layout.channels))
        except MediaStreamError:
            if not self.closing:
                self._spawn(self.close("client audio ended"), "close")

    async def _watchdog(self) -> None:
        while not self.closing:
            await asyncio.sleep(0.25)
            idle = time.monotonic() - self.last_media
            limit = self.media_timeout_s if self.got_media else self.connect_timeout_s
            if idle > limit:
                reason = "no audio from client" if self.got_media else "client never connected"
                self._spawn(self.close(f"{reason} for {idle:.1f} s"), "close")
                return

    # -- helpers -----------------------------------------------------------------------------------
    def _send_event(self, ev: SessionEvent) -> None:
        self._send_json(ev.to_json())

    def _send_text(self, text: str) -> None:
        self._send_json({"type": "duplex_text", "text": text})

    def _send_overrun(self, event: dict) -> None:
        self._send_json({**event, "type": "duplex_tick_overrun"})

    def _send_json(self, ev: str | dict) -> None:
        text = ev if isinstance(ev, str) else json.dumps(ev)
        ch = self.channel
        if ch is not None and ch.readyState == "open":
            ch.send(text)
        elif len(self.pending) < 256:
            self.pending.append(text)

    def _flush_pending(self) -> None:
        pending, self.pending = self.pending, []
        for text in pending:
            self.channel.send(text)

    def _spawn(self, coro, name: str) -> asyncio.Task:
        return self.tasks.spawn(coro, name)
