"""The WebRTC transport: one aiortc peer connection adapted to one :class:`~omniduplex.app.session.Session`.

* Inbound: the browser's Opus track (decoded by aiortc to 48 kHz) → mono 16 kHz → 20 ms frames →
  :meth:`Session.push_audio`.
* Outbound: :class:`SessionAudioTrack` pulls one 20 ms, 48 kHz frame from the session when it is
  due on the wire (real-time pacing, nothing buffered ahead), aiortc encodes it as Opus.
* A data channel (opened by the client) carries the session's events as JSON, one per message.
  The client may send ``{"type": "bye"}`` (hang up) and ``{"type": "greet"}`` (the kiosk: have the
  assistant welcome a visitor, :func:`~omniduplex.app.kiosk.speak_greeting`).
* The session is closed when the connection fails or closes, when the client says ``bye``, or when
  no inbound audio arrives for ``media_timeout_s`` (a client that vanished without a goodbye).
"""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import time
from collections.abc import Awaitable, Callable

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from omniduplex.app.events import SessionEvent
from omniduplex.app.kiosk import speak_greeting
from omniduplex.app.replies import Responder
from omniduplex.app.session import Session, SessionConfig
from omniduplex.app.vad import FRAME_SAMPLES, SAMPLE_RATE

log = logging.getLogger("omniduplex.webrtc")

WIRE_RATE = 48000
"""Opus clock rate both ways (Hz)."""
PTIME_S = 0.020
"""Outbound frame period (s)."""
WIRE_FRAME = int(WIRE_RATE * PTIME_S)
"""Samples per outbound frame (960)."""
MAX_LAG_S = 0.060
"""If the pacer falls this far behind (a stalled event loop), it re-anchors instead of bursting."""


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
    """Outbound audio: 20 ms, 48 kHz mono s16 frames pulled from the session at real-time pace."""

    kind = "audio"

    def __init__(self, session: Session, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.session, self.clock = session, clock
        self.anchor: float | None = None  # clock time of frame `sent_since_anchor == 0`
        self.since_anchor = 0
        self.pts = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = self.clock()
        if self.anchor is None:
            self.anchor = now
        else:
            self.since_anchor += 1
            due = self.anchor + self.since_anchor * PTIME_S
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > MAX_LAG_S:
                self.anchor, self.since_anchor = now, 0
        pcm, _ = self.session.pull_audio(WIRE_FRAME)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = WIRE_RATE
        frame.pts = self.pts
        frame.time_base = fractions.Fraction(1, WIRE_RATE)
        self.pts += WIRE_FRAME
        return frame


class FrameChunker:
    """Regroups arbitrary-length int16 chunks into exact ``size``-sample frames (bounded buffer)."""

    def __init__(self, size: int = FRAME_SAMPLES) -> None:
        self.size = size
        self.buf = np.zeros(0, np.int16)

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        x = np.concatenate([self.buf, pcm]) if self.buf.size else pcm
        n = x.size // self.size
        frames = [x[i * self.size : (i + 1) * self.size] for i in range(n)]
        self.buf = x[n * self.size :].copy()
        return frames


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
    ) -> None:
        self.id, self.on_closed = session_id, on_closed
        self.media_timeout_s, self.connect_timeout_s = media_timeout_s, connect_timeout_s
        cfg.output_rate = WIRE_RATE
        self.pc = RTCPeerConnection()
        self.channel = None
        self.pending: list[str] = []  # events emitted before the data channel opened
        self.session = Session(session_id, responder, self._send_event, cfg, turn_model=turn_model)
        self.out_track = SessionAudioTrack(self.session)
        self.tasks: set[asyncio.Task] = set()
        self.last_media = time.monotonic()
        self.got_media = False
        self.closing = False
        self.done = asyncio.Event()
        self.inbound_frames = 0
        self.greeting = "Hello! How can I help?"  # spoken on a {"type": "greet"} message (app.kiosk)

    async def answer(self, sdp: str) -> str:
        """Apply the client's offer and return the answer SDP (ICE candidates included).

        Raises:
            OfferError: aiortc rejected the SDP (the peer is closed again).
        """
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
            current = asyncio.current_task()
            for t in list(self.tasks):
                if t is not current:
                    t.cancel()
            await asyncio.gather(*(t for t in self.tasks if t is not current), return_exceptions=True)
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
        elif isinstance(msg, dict) and msg.get("type") == "greet" and not self.closing:
            speak_greeting(self.session, self.greeting)  # the kiosk: a visitor walked up and tapped

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        log.info("session %s connection %s", self.id, state)
        if state in ("failed", "closed") and not self.closing:
            self._spawn(self.close(f"connection {state}"), "close")

    # -- loops -------------------------------------------------------------------------------------
    async def _inbound(self, track: MediaStreamTrack) -> None:
        """Decoded 48 kHz Opus → 16 kHz mono int16 → 20 ms frames into the session."""
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        chunker = FrameChunker()
        try:
            while True:
                frame = await track.recv()
                self.last_media, self.got_media = time.monotonic(), True
                self.inbound_frames += 1
                for out in resampler.resample(frame):
                    for f in chunker.push(out.to_ndarray().reshape(-1)):
                        self.session.push_audio(f)
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
        text = ev.to_json()
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
        t = asyncio.get_running_loop().create_task(coro, name=f"{self.id}-{name}")
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return t
