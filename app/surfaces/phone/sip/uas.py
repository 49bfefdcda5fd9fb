"""A small SIP user agent server on asyncio: answers calls into :class:`~.call.SipCall` sessions.

The RFC 3261 subset implemented (everything else is answered 405 or ignored):

* Transports (§18): UDP (one datagram = one message) and TCP (framed by Content-Length) on one
  ``host:port``. Responses go back to the source address / over the same connection (symmetric, like
  RFC 3581 ``rport``); Record-Route and route sets are not kept.
* Server transactions (§17.2), reduced: a retransmitted request (same top-Via branch and CSeq) gets the
  last response again; final responses to INVITE over UDP are retransmitted (T1 doubling to T2) until the
  ACK arrives or 64·T1 passes — for a 2xx a missing ACK ends the call (§13.3.1.4).
* INVITE (new dialog): 100 Trying → admission (:mod:`.auth`: digest 401 / allow-list 403) → limits (503 +
  Retry-After beyond ``max_calls``, when the server's session slots are full, while its stages start or
  restart — with the reason in a Warning, :mod:`omniduplex.app.host.readiness` — or no RTP port free) → SDP
  offer (no body: 488 — delayed offer is not implemented; unparseable: 400; no PCMU/PCMA: 488 with a
  Warning, §20.43) → 180 Ringing when ``ring_s`` > 0 → 200 OK with the SDP answer and a Contact.
* re-INVITE (To tag present, §14.2): new offer → 200 OK with a new answer (hold ``a=sendonly`` /
  ``inactive``, resume ``a=sendrecv``), or 488 keeping the old media.
* ACK, BYE (200, call ends; 481 for an unknown dialog), CANCEL (§9.2: 200 to the CANCEL, 487 to the
  ringing INVITE; 481 when no such transaction), OPTIONS (200 with Allow/Accept).
* Malformed requests: missing Via/From/To/Call-ID/CSeq, a CSeq whose method differs, bad Content-Length →
  400 (sent to the source address even without a Via); unparseable junk is dropped. One call's failure
  never touches another's state.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import replace

from omniduplex.app.core.session_config import FAILURE_APOLOGY
from omniduplex.app.core.tasks import Tasks
from omniduplex.app.host.admission import Refused, new_call_id
from omniduplex.app.host.duplex import DuplexFull
from omniduplex.app.host.readiness import RETRY_AFTER_S, unready_reason
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.phone.config import SipConfig
from omniduplex.app.surfaces.phone.sip import message as sipmsg
from omniduplex.app.surfaces.phone.sip import sdp
from omniduplex.app.surfaces.phone.sip.auth import Gate
from omniduplex.app.surfaces.phone.sip.call import T1, T2, SipCall
from omniduplex.app.surfaces.phone.sip.rtp import PortPool
from omniduplex.app.surfaces.phone.sip.transport import Peer, UdpTransport, tcp_connection

log = logging.getLogger("omniduplex.phone.sip")
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS"
TRANSACTION_TTL_S = 32.0
"""How long a server transaction's last response is kept for retransmitted requests (64·T1)."""


class SipServer:
    """The UAS: listens on ``cfg.host:cfg.port`` (UDP and TCP) and runs calls over ``host``'s pipeline, each
    admitted to its session table."""

    def __init__(self, host: ServerState, cfg: SipConfig) -> None:
        self.host, self.cfg = host, cfg
        self.ports = PortPool(*cfg.rtp_ports)
        self.gate = Gate(cfg.users, cfg.allow, cfg.realm)
        self.calls: dict[str, SipCall] = {}  # by Call-ID
        self.transactions: dict[tuple, tuple[float, bytes]] = {}  # (branch, cseq, method) → (time, response)
        self.awaiting_ack: dict[tuple[str, int], asyncio.Event] = {}  # (Call-ID, CSeq number)
        self.tasks = Tasks("sip")
        self.udp: asyncio.DatagramTransport | None = None
        self.tcp: asyncio.base_events.Server | None = None
        self.stats = {"invites": 0, "answered": 0, "rejected": {}, "malformed": 0}

    @property
    def responder(self):
        return self.host.responder

    @property
    def turn_model(self):
        return self.host.turn_model

    @property
    def tool_runner(self):
        return getattr(self.host, "tool_runner", None)

    async def start(self) -> None:
        """Bind UDP and TCP. Raises ``OSError`` when the address is taken."""
        loop = asyncio.get_running_loop()
        self.udp, _ = await loop.create_datagram_endpoint(
            lambda: UdpTransport(self.on_data), local_addr=(self.cfg.host, self.cfg.port)
        )
        self.tcp = await asyncio.start_server(
            tcp_connection(self.on_data, self._malformed), self.cfg.host, self.cfg.port
        )
        log.info(
            "SIP UAS on %s:%d (UDP, TCP), RTP ports %d-%d, max %d calls",
            self.cfg.host,
            self.cfg.port,
            *self.cfg.rtp_ports,
            self.cfg.max_calls,
        )

        if not self.cfg.users and not self.cfg.allow:
            log.warning(
                "SIP UAS admits any caller: set digest users (--sip-user) or an allow-list (--sip-allow)"
            )

    async def stop(self) -> None:
        """Hang up every call (BYE), then close the sockets."""
        await asyncio.gather(*(c.close("server shutdown") for c in list(self.calls.values())))
        await self.tasks.cancel()
        if self.udp is not None:
            self.udp.close()
        if self.tcp is not None:
            self.tcp.close()
            await self.tcp.wait_closed()

    # -- dispatch --------------------------------------------------------------------------------------
    def on_data(self, data: bytes, peer: Peer) -> None:
        """One message from ``peer``. Never raises: errors are answered or logged, per message."""
        if not data.strip():
            return  # keep-alive
        try:
            msg = sipmsg.parse(data)
        except sipmsg.SipParseError as e:
            self.stats["malformed"] += 1
            log.warning("SIP from %s: %s", peer.addr, e.reason)
            if e.message is not None and e.message.is_request and e.message.method != "ACK":
                peer.send(
                    sipmsg.response(e.message, e.status, headers=[("Warning", _warning(399, e.reason))])
                )
            return
        try:
            if msg.is_request:
                self._request(msg, peer)
            else:
                call = self.calls.get(msg.call_id)
                if call is not None and msg.status >= 200 and msg.cseq[1] == "BYE":
                    call.bye_answered.set()
        except Exception:
            log.exception("SIP %s from %s failed", msg.method or msg.status, peer.addr)
            if msg.is_request and msg.method != "ACK":
                peer.send(sipmsg.response(msg, 500))

    def _malformed(self) -> None:
        self.stats["malformed"] += 1

    def _request(self, req: sipmsg.SipMessage, peer: Peer) -> None:
        missing = [h for h in sipmsg.REQUIRED if not req.get(h)]
        try:
            number, method = req.cseq
        except sipmsg.SipParseError as e:
            missing.append(e.reason)
            number, method = 0, ""
        if missing or method != req.method:
            self.stats["malformed"] += 1
            why = f"missing {', '.join(missing)}" if missing else f"CSeq method {method} ≠ {req.method}"
            log.warning("SIP %s from %s: %s", req.method, peer.addr, why)
            if req.method != "ACK":
                self._respond(peer, req, 400, headers=[("Warning", _warning(399, why))])
            return
        key = (req.branch or req.call_id, number, req.method)
        cached = self.transactions.get(key)
        if cached is not None and req.method != "ACK":
            peer.send(cached[1])  # a retransmission: same answer
            return
        handler = {
            "INVITE": self._invite,
            "ACK": self._ack,
            "BYE": self._bye,
            "CANCEL": self._cancel,
            "OPTIONS": self._options,
        }.get(req.method)
        if handler is None:
            self._respond(peer, req, 405, headers=[("Allow", ALLOW)])
        else:
            handler(req, peer)

    def _respond(
        self,
        peer: Peer,
        req: sipmsg.SipMessage,
        status: int,
        to_tag: str = "",
        headers=None,
        body: bytes = b"",
    ) -> bytes:
        data = sipmsg.response(req, status, to_tag or sipmsg.new_tag(), headers, body)
        now = time.monotonic()
        self.transactions[(req.branch or req.call_id, req.cseq[0], req.method)] = (now, data)
        if len(self.transactions) > 256:
            self.transactions = {k: v for k, v in self.transactions.items() if now - v[0] < TRANSACTION_TTL_S}
        if status >= 300 and req.method == "INVITE":
            self.stats["rejected"][status] = self.stats["rejected"].get(status, 0) + 1
        peer.send(data)
        if req.method == "INVITE" and status >= 200 and peer.transport == "UDP":
            self._spawn(self._retransmit_until_ack(peer, req, data, status), "retransmit")
        return data

    async def _retransmit_until_ack(self, peer: Peer, req: sipmsg.SipMessage, data: bytes, status: int):
        key = (req.call_id, req.cseq[0])
        acked = self.awaiting_ack[key] = asyncio.Event()
        wait, waited = T1, 0.0
        try:
            while waited < 64 * T1:
                try:
                    await asyncio.wait_for(acked.wait(), wait)
                    return
                except asyncio.TimeoutError:
                    waited += wait
                    wait = min(2 * wait, T2)
                    peer.send(data)
            call = self.calls.get(req.call_id)
            if status < 300 and call is not None:
                self._spawn(call.close("no ACK for our 200 OK"), "close")
        finally:
            if self.awaiting_ack.get(key) is acked:
                del self.awaiting_ack[key]

    # -- methods ---------------------------------------------------------------------------------------
    def _options(self, req, peer) -> None:
        self._respond(peer, req, 200, headers=[("Allow", ALLOW), ("Accept", "application/sdp")])

    def _ack(self, req, peer) -> None:
        ev = self.awaiting_ack.get((req.call_id, req.cseq[0]))
        if ev is not None:
            ev.set()
        call = self.calls.get(req.call_id)
        if call is not None:
            call.acked.set()

    def _bye(self, req, peer) -> None:
        call = self.calls.get(req.call_id)
        if call is None or call.state == "ringing" or req.tag("From") != call.remote_tag:  # §12.2.2
            self._respond(peer, req, 481)
            return
        self._respond(peer, req, 200, to_tag=call.local_tag)
        self._spawn(call.close("caller hung up", send_bye=False), "close")

    def _cancel(self, req, peer) -> None:
        call = self.calls.get(req.call_id)
        if call is None:
            self._respond(peer, req, 481)
            return
        self._respond(peer, req, 200, to_tag=call.local_tag)
        if call.state == "ringing":
            self._respond(peer, call.invite, 487, to_tag=call.local_tag)
            self._spawn(call.close("caller cancelled", send_bye=False), "close")

    def _invite(self, req, peer) -> None:
        call = self.calls.get(req.call_id)
        if req.tag("To"):
            if call is None or req.tag("To") != call.local_tag:
                self._respond(peer, req, 481)
            else:
                self._reinvite(call, req, peer)
            return
        if call is not None:  # a second dialog-creating INVITE with this Call-ID (new branch)
            self._respond(peer, req, 482)
            return
        self.stats["invites"] += 1
        self._respond(peer, req, 100)
        self._spawn(self._new_call(req, peer), "invite")

    async def _new_call(self, req, peer) -> None:
        verdict = self.gate.check(peer.addr[0], "INVITE", req.get("Authorization"))
        if verdict.status:
            log.info("INVITE %s from %s refused: %s", req.call_id, peer.addr, verdict.reason)
            hdrs = [("WWW-Authenticate", verdict.challenge)] if verdict.challenge else []
            self._respond(peer, req, verdict.status, headers=hdrs)
            return
        reason = unready_reason(self.host)
        if reason is not None:  # before a call (and its Session) exists
            log.info("INVITE %s from %s refused (503): %s", req.call_id, peer.addr, reason)
            retry = [("Retry-After", str(RETRY_AFTER_S)), ("Warning", _warning(399, reason))]
            self._respond(peer, req, 503, headers=retry)
            return
        if len(self.calls) >= self.cfg.max_calls:
            self._respond(
                peer,
                req,
                503,
                headers=[("Retry-After", "5"), ("Warning", _warning(399, f"{self.cfg.max_calls} calls"))],
            )
            return
        try:
            neg = self._negotiate(req)
        except sdp.SdpError as e:
            log.info("INVITE %s from %s: %s", req.call_id, peer.addr, e.reason)
            self._respond(peer, req, e.status, headers=[("Warning", _warning(e.warning, e.reason))])
            return
        try:
            session = replace(self.host.cfg.session, failure_apology=FAILURE_APOLOGY)  # said if a reply fails
            duplex = self.host.duplex if "phone" in self.host.cfg.duplex_surfaces else None
            call = SipCall(self, new_call_id("sip"), req, peer, neg, session, duplex=duplex)
        except RuntimeError as e:  # no RTP port
            self._respond(peer, req, 503, headers=[("Retry-After", "5"), ("Warning", _warning(399, str(e)))])
            return
        self.calls[req.call_id] = call
        try:
            self.host.admit(call)
            await call.open_rtp(self.cfg.host)
            if call.duplex is not None:
                await call.duplex.open()  # DuplexFull: every engine row taken
        except (Refused, OSError, DuplexFull) as e:
            self._respond(peer, req, 503, headers=[("Retry-After", "5"), ("Warning", _warning(399, str(e)))])
            await call.close(str(e), send_bye=False)
            return
        if self.cfg.ring_s > 0:
            self._respond(peer, req, 180, to_tag=call.local_tag)
            await asyncio.sleep(self.cfg.ring_s)
            if call.closing:
                return  # cancelled while ringing
        call.state = "confirmed"
        call.start_media()
        self.stats["answered"] += 1
        self._answer(peer, req, call, neg, [("Allow", ALLOW)])
        log.info(
            "call %s (%s) answered: %s/%d ↔ %s:%d, %s",
            call.id,
            req.call_id,
            neg.codec,
            neg.pt,
            *neg.remote,
            neg.direction,
        )

    def _reinvite(self, call: SipCall, req, peer) -> None:
        try:
            neg = self._negotiate(req)
        except sdp.SdpError as e:
            self._respond(
                peer,
                req,
                e.status,
                to_tag=call.local_tag,
                headers=[("Warning", _warning(e.warning, e.reason))],
            )
            return
        call.apply(neg)
        call.sdp_version += 1
        self._answer(peer, req, call, neg)

    def _answer(self, peer: Peer, req, call: SipCall, neg: sdp.Negotiated, headers=()) -> None:
        """200 OK to an (re-)INVITE with our SDP answer for ``neg`` and a Contact (then ``headers``)."""
        body = sdp.answer(neg, self.media_host(peer), call.port, id(call) & 0xFFFFFFFF, call.sdp_version)
        contact = ("Contact", f"<sip:omniduplex@{self.advertised(peer)}>")
        self._respond(peer, req, 200, to_tag=call.local_tag, body=body.encode(), headers=[contact, *headers])

    @staticmethod
    def _negotiate(req) -> sdp.Negotiated:
        ctype = (req.get("Content-Type") or "").split(";")[0].strip().lower()
        if not req.body.strip():
            raise sdp.SdpError("an SDP offer is required (delayed offer is not supported)", 488, 399)
        if ctype != "application/sdp":
            raise sdp.SdpError(f"body is {ctype or 'untyped'}, not application/sdp", 488, 399)
        try:
            text = req.body.decode("utf-8")
        except UnicodeDecodeError:
            raise sdp.SdpError("SDP is not UTF-8", 400) from None
        return sdp.negotiate(sdp.parse(text))

    # -- helpers ---------------------------------------------------------------------------------------
    def media_host(self, peer: Peer) -> str:
        """The address for SDP ``c=``: ``public_host``, the bound host, or the local address toward peer."""
        if self.cfg.public_host:
            return self.cfg.public_host
        if self.cfg.host not in ("0.0.0.0", "::", ""):
            return self.cfg.host
        if peer.local[0] not in ("0.0.0.0", "::"):
            return peer.local[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer.addr[0], 9))
            return s.getsockname()[0]

    def advertised(self, peer: Peer) -> str:
        """``host:port[;transport=tcp]`` for Contact and Via."""
        suffix = ";transport=tcp" if peer.transport == "TCP" else ""
        return f"{self.media_host(peer)}:{self.cfg.port}{suffix}"

    def forget(self, call: SipCall) -> None:
        """Called by a call once it has ended: frees its Call-ID and session slot."""
        if self.calls.get(call.call_id) is call:
            del self.calls[call.call_id]
        self.host.release(call)

    def _spawn(self, coro, name: str) -> asyncio.Task:
        return self.tasks.spawn(coro, name)


def _warning(code: int, text: str) -> str:
    """A Warning header value (RFC 3261 §20.43): ``code agent "text"``."""
    return f'{code} omniduplex "{text.replace(chr(34), chr(39))}"'


async def start_sip(host: ServerState, cfg: SipConfig) -> SipServer:
    """Start the UAS for a running server (its responder must exist); ``await stop()`` it at shutdown."""
    server = SipServer(host, cfg)
    await server.start()
    return server
