"""One SIP call: its dialog (RFC 3261 §12), its RTP stream and the
:class:`~omniduplex.app.core.session.Session`.

Media runs on the call's :class:`~omniduplex.app.core.audio.AudioPort` clock (:meth:`SipCall._tick`, every 20
ms):
each tick takes one frame from the jitter buffer (silence when none is due: the session keeps counting frames,
so endpointing works when a caller stops sending), decodes G.711 into the port (8 → 16 kHz session frames),
then pulls one 20 ms frame at 8 kHz from the port (the reply, or silence while not speaking: a phone expects a
steady stream) and sends it as one RTP packet. On a barge-in the session's playout is flushed, so the very
next packet is silence. On hold (our direction ``recvonly``/``inactive``) nothing is sent, but the session's
clock runs. On the duplex model (``serve --duplex-surfaces phone``) the same clock runs over a
:class:`~omniduplex.app.host.duplex_port.DuplexPort` instead: the caller's audio goes to the model every
frame, and every packet carries the model's audio (no VAD, no turns; barge-in is the model's own).

The call ends (BYE sent unless the caller sent one) on: the caller's BYE or CANCEL, no RTP for
``rtp_timeout_s`` while ``sendrecv``, ``call_timeout_s``, no ACK for our 200 (64·T1 = 32 s), or shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from omniduplex.app.core.audio import AudioPort
from omniduplex.app.core.events import SessionEvent
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tasks import Tasks
from omniduplex.app.host.duplex import DuplexService
from omniduplex.app.host.duplex_port import DuplexPort
from omniduplex.app.surfaces.phone.sip import message as sipmsg
from omniduplex.app.surfaces.phone.sip.rtp import JitterBuffer, RtpEndpoint, RtpPacket, parse_dtmf
from omniduplex.app.surfaces.phone.sip.sdp import Negotiated
from omniduplex.app.surfaces.wire.g711 import CODECS, TELEPHONE_RATE

if TYPE_CHECKING:
    from omniduplex.app.core.replies import Responder
    from omniduplex.app.core.turn_detection import TurnModel
    from omniduplex.app.surfaces.phone.config import SipConfig
    from omniduplex.app.surfaces.phone.sip.rtp import PortPool
    from omniduplex.app.surfaces.phone.sip.transport import Peer

log = logging.getLogger("omniduplex.phone.sip.call")
T1 = 0.5
"""RFC 3261 §17.1.1.1 round-trip estimate (s); UDP retransmissions start at T1 and double up to T2."""
T2 = 4.0


class CallServer(Protocol):
    """What a call needs of the UAS that answered it (:class:`~.uas.SipServer`)."""

    cfg: SipConfig
    ports: PortPool
    """The RTP port pool: a call takes one port and gives it back when it ends."""

    @property
    def responder(self) -> Responder: ...

    @property
    def turn_model(self) -> TurnModel | None:
        """The shared end-of-turn model (``turn_detection="smart"``)."""

    def advertised(self, peer: Peer) -> str:
        """``host:port[;transport=tcp]`` for our Via."""

    def forget(self, call: SipCall) -> None:
        """The call has ended: free its Call-ID and session slot."""


class SipCall:
    """A confirmed or ringing dialog with its media. Created by the UAS for an acceptable INVITE.

    Args:
        server: the UAS (:class:`CallServer`: frees our slot, owns the RTP port pool).
        call_id: the dialog's Call-ID; ``invite``: the initial INVITE; ``peer``: where it came from.
        neg: the negotiated audio stream; ``session_cfg``: copied, ``output_rate`` set to 8000 Hz.
        duplex: run this duplex model instead of the cascade: a
            :class:`~omniduplex.app.host.duplex_port.DuplexPort` takes the session's and the port's place
            (8 kHz both ways, no VAD, no turns); :meth:`open_duplex` joins its engine.
    """

    def __init__(
        self,
        server: CallServer,
        sid: str,
        invite: sipmsg.SipMessage,
        peer: Peer,
        neg: Negotiated,
        session_cfg: SessionConfig,
        clock=time.monotonic,
        duplex: DuplexService | None = None,
    ) -> None:
        self.server, self.id, self.peer, self.neg, self.clock = server, sid, peer, neg, clock
        self.call_id = invite.call_id
        self.local_tag = sipmsg.new_tag()
        self.remote_tag = invite.tag("From")
        self.invite = invite
        self.remote_target = sipmsg.uri_of(invite.get("Contact") or invite.get("From") or "")
        self.cseq = 1
        self.sdp_version = 1
        self.state = "ringing"  # → "confirmed" (200 sent) → "ended"
        self.acked = asyncio.Event()
        self.bye_answered = asyncio.Event()
        cfg = replace(session_cfg, output_rate=TELEPHONE_RATE)
        self.duplex = None
        if duplex is not None:
            self.session = self.audio = self.duplex = DuplexPort(duplex, sid, TELEPHONE_RATE, TELEPHONE_RATE)
        else:
            self.session = Session(
                sid,
                server.responder,
                self._on_event,
                cfg,
                clock=clock,
                turn_model=server.turn_model,
                tool_runner=getattr(server, "tool_runner", None),
            )
            self.audio = AudioPort(self.session, TELEPHONE_RATE, clock=clock)
        self.jitter = JitterBuffer()
        self.silence_in = np.zeros(self.audio.out_frame, np.int16)  # a frame the jitter buffer lacks
        self.port = server.ports.take()
        self.rtp = RtpEndpoint(self._on_rtp)
        self.digits: list[str] = []
        self._last_dtmf_ts: int | None = None
        self.t_start = self.last_rtp = clock()
        self.tasks = Tasks(sid)
        self.closing = False
        self.done = asyncio.Event()
        self.ended_reason = ""
        self.apply(neg)

    # -- setup ---------------------------------------------------------------------------------------
    async def open_rtp(self, host: str) -> None:
        """Bind our RTP socket on ``host``:``port``.

        Raises:
            OSError: the port is taken by another process.
        """
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self.rtp, local_addr=(host, self.port))

    def apply(self, neg: Negotiated) -> None:
        """Use a (re-)negotiated stream: codec, remote address, direction (hold/resume)."""
        old = getattr(self, "neg", None)
        self.neg = neg
        self.encode, self.decode, self.silence = CODECS[neg.codec]
        self.rtp.remote = neg.remote
        self.rtp.accept_pts = {neg.pt} | ({neg.dtmf_pt} if neg.dtmf_pt is not None else set())
        if old is not None and old.direction != neg.direction:
            log.info("%s: media direction %s → %s", self.id, old.direction, neg.direction)
            self.last_rtp = self.clock()

    def start_media(self) -> None:
        self._spawn(self.audio.run(self._tick), "media")

    # -- RTP → session -------------------------------------------------------------------------------
    def _on_rtp(self, pkt: RtpPacket) -> None:
        self.last_rtp = self.clock()
        if pkt.pt == self.neg.dtmf_pt:
            ev = parse_dtmf(pkt.payload)
            if ev is not None and ev[1] and pkt.ts != self._last_dtmf_ts:
                self._last_dtmf_ts = pkt.ts
                self.digits.append(ev[0])
                log.info("%s: DTMF %s (%d ms)", self.id, ev[0], ev[2] // 8)
            return
        if getattr(self, "_ssrc", pkt.ssrc) != pkt.ssrc:
            self.jitter.reset()
        self._ssrc = pkt.ssrc
        self.jitter.push(pkt.seq, pkt.payload)

    def _tick(self, due: float) -> None:
        """One 20 ms tick of the call's clock: one frame in, one frame out (module docstring)."""
        if self.closing:
            return
        payload = self.jitter.pop()
        self.audio.push(self.decode(payload) if payload else self.silence_in)
        out, _ = self.audio.pull()
        if self.neg.we_send:
            self.rtp.send_frame(self.neg.pt, self.encode(out))
        else:
            self.rtp.skip(out.size)
        self._check_timeouts()

    def _check_timeouts(self) -> None:
        now = self.clock()
        cfg = self.server.cfg
        if self.neg.direction == "sendrecv" and now - self.last_rtp > cfg.rtp_timeout_s:
            self._spawn(self.close(f"no RTP for {now - self.last_rtp:.1f} s"), "close")
        elif now - self.t_start > cfg.call_timeout_s:
            self._spawn(self.close(f"call longer than {cfg.call_timeout_s:.0f} s"), "close")

    def _on_event(self, ev: SessionEvent) -> None:
        log.debug("%s: %s", self.id, ev.to_json())

    # -- dialog ----------------------------------------------------------------------------------------
    def bye_request(self) -> bytes:
        """Our BYE (RFC 3261 §15.1.1): From = the INVITE's To with our tag, To = its From, CSeq++."""
        self.cseq += 1
        to = self.invite.get("To") or ""
        if not self.invite.tag("To"):
            to = f"{to};tag={self.local_tag}"
        via = (
            f"SIP/2.0/{self.peer.transport} {self.server.advertised(self.peer)};branch={sipmsg.new_branch()}"
        )
        headers = [
            ("Via", via),
            ("From", to),
            ("To", self.invite.get("From") or ""),
            ("Call-ID", self.call_id),
            ("CSeq", f"{self.cseq} BYE"),
        ]
        return sipmsg.request("BYE", self.remote_target or "sip:caller", headers)

    async def _send_bye(self) -> None:
        data, wait = self.bye_request(), T1
        for _ in range(4 if self.peer.transport == "UDP" else 1):
            self.peer.send(data)
            try:
                await asyncio.wait_for(self.bye_answered.wait(), wait)
                return
            except asyncio.TimeoutError:
                wait = min(2 * wait, T2)

    async def close(self, reason: str, send_bye: bool = True) -> None:
        """End the call: BYE (when confirmed and ``send_bye``), close the session, free RTP and the slot.
        Idempotent; concurrent callers wait for the first."""
        if self.closing:
            await self.done.wait()
            return
        self.closing, self.ended_reason = True, reason
        log.info("%s: call ending: %s", self.id, reason)
        try:
            if send_bye and self.state == "confirmed":
                await self._send_bye()
            self.state = "ended"
            await self.tasks.cancel()
            await self.session.close(reason)
        finally:
            self.rtp.close()
            self.server.ports.give(self.port)
            self.server.forget(self)
            self.done.set()
            log.info(
                "%s: ended (%s); rtp in %d, out %d, ignored %d source / %d payload type; jitter lost %d, "
                "late %d",
                self.id,
                reason,
                self.rtp.received,
                self.rtp.sent,
                self.rtp.ignored_source,
                self.rtp.ignored_pt,
                self.jitter.lost,
                self.jitter.late,
            )

    def _spawn(self, coro, name: str) -> asyncio.Task:
        return self.tasks.spawn(coro, name)
