"""HTTP and WebSocket routes of the Twilio-compatible phone bridge (:func:`router`).

Routes:
    ``POST /phone/twilio/voice``   the incoming-call webhook: TwiML that connects the call to the stream
                                   (``<Connect><Stream>`` = bidirectional). 403 on a bad signature; 503 with
                                   ``Retry-After`` and the reason while the stages start or restart.
    ``WS   /phone/twilio/stream``  the Media Streams WebSocket, one call each (:mod:`.twilio`; on the duplex
                                   model, :mod:`.twilio_duplex`, with ``?duplex=1``, or by default when
                                   ``serve --duplex-surfaces`` names ``phone``; ``?duplex=0``: the cascade;
                                   a ``?duplex=`` on the voice webhook's URL is passed on to it). A bad
                                   signature refuses the handshake (403); a full server, or one whose stages
                                   are starting or restarting, closes with 1013 "try again later" and the
                                   reason (:mod:`omniduplex.app.host.readiness`), before any session exists.

Signatures (Twilio docs, "Webhooks Security"): ``X-Twilio-Signature`` = base64(HMAC-SHA1(auth token, URL +
every POST parameter's name and value, sorted by name)); the URL is the one Twilio requested, query string
included; the WebSocket handshake is signed over its ``wss://`` URL with no parameters.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
from dataclasses import replace
from urllib.parse import parse_qsl
from xml.sax.saxutils import quoteattr

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import PlainTextResponse, Response
from starlette.websockets import WebSocketDisconnect

from omniduplex.app.core.session_config import FAILURE_APOLOGY
from omniduplex.app.host.admission import Refused, new_call_id
from omniduplex.app.host.auth import Access
from omniduplex.app.host.config import DUPLEX_ONLY
from omniduplex.app.host.readiness import CLOSE_TRY_AGAIN_LATER, RETRY_AFTER_S, close_reason, unready_reason
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.phone.config import TwilioConfig
from omniduplex.app.surfaces.phone.twilio import TwilioBridge
from omniduplex.app.surfaces.phone.twilio_duplex import TwilioDuplexBridge

log = logging.getLogger("omniduplex.phone.twilio")
STREAM_PATH = "/phone/twilio/stream"


def twilio_signature(auth_token: str, url: str, params: list[tuple[str, str]] | None = None) -> str:
    """The ``X-Twilio-Signature`` Twilio sends for a request to ``url`` with POST ``params``."""
    data = url + "".join(k + v for k, v in sorted(params or []))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signature_ok(auth_token: str, signature: str | None, urls: list[str], params=None) -> bool:
    """Whether ``signature`` matches any of the candidate ``urls`` (constant-time compare)."""
    if not signature:
        return False
    return any(hmac.compare_digest(twilio_signature(auth_token, u, params), signature) for u in urls)


def _base_urls(cfg: TwilioConfig, headers, scheme: str) -> list[str]:
    """``scheme://host`` candidates Twilio may have used: the configured public URL, else the request's."""
    if cfg.public_url:
        return [cfg.public_url.rstrip("/")]
    proto = headers.get("x-forwarded-proto", scheme).split(",")[0].strip()
    host = headers.get("x-forwarded-host") or headers.get("host", "")
    return [f"{proto}://{host}"]


def _with_query(path: str, query: str) -> str:
    return f"{path}?{query}" if query else path


def _ws_scheme(base: str) -> str:
    return (
        "wss" + base[5:] if base.startswith("https") else "ws" + base[4:] if base.startswith("http") else base
    )


def connect_stream_twiml(stream_url: str, parameters: dict[str, str] | None = None) -> str:
    """``<Response><Connect><Stream url=…/></Connect></Response>`` (TwiML ``<Stream>``; ``<Parameter>``
    children arrive as the ``start`` message's ``customParameters``)."""
    params = "".join(
        f"<Parameter name={quoteattr(k)} value={quoteattr(v)}/>" for k, v in (parameters or {}).items()
    )
    stream = (
        f"<Stream url={quoteattr(stream_url)}>{params}</Stream>"
        if params
        else (f"<Stream url={quoteattr(stream_url)}/>")
    )
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Connect>{stream}</Connect></Response>'


class TwilioCall:
    """A media-stream WebSocket and its :class:`TwilioBridge`; closing it hangs up the stream."""

    def __init__(self, ws: WebSocket, bridge: TwilioBridge | TwilioDuplexBridge) -> None:
        self.ws, self.bridge = ws, bridge
        self.id, self.session = bridge.id, bridge.session

    async def close(self, reason: str) -> None:
        try:
            await self.bridge.close(reason)
        finally:
            with contextlib.suppress(Exception):  # already closed by the peer (RuntimeError, disconnect)
                await self.ws.close()


async def twilio_voice(host: ServerState, cfg: TwilioConfig, request: Request) -> Response:
    """Answer Twilio's incoming-call webhook with TwiML connecting the call to our media stream."""
    body = (await request.body()).decode("utf-8", "replace")
    params = parse_qsl(body, keep_blank_values=True)
    bases = _base_urls(cfg, request.headers, request.url.scheme)
    if cfg.auth_token:
        urls = [b + _with_query(request.url.path, request.url.query) for b in bases]
        if not signature_ok(cfg.auth_token, request.headers.get("x-twilio-signature"), urls, params):
            log.warning("twilio webhook from %s: bad or missing X-Twilio-Signature", request.client)
            return PlainTextResponse("invalid X-Twilio-Signature", status_code=403)
    reason = unready_reason(host)
    if reason is not None:
        log.warning("twilio call refused (503): %s", reason)
        return PlainTextResponse(reason, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
    form = dict(params)
    stream_url = _ws_scheme(bases[0]) + STREAM_PATH
    if not cfg.public_url and not stream_url.startswith("wss://"):
        stream_url = "wss://" + stream_url.split("://", 1)[1]  # Twilio connects over TLS only
    choice = request.query_params.get("duplex")
    if choice in ("0", "1", "true", "false"):
        stream_url += f"?duplex={choice}"
    extra = {k: form[k] for k in ("From", "To", "CallSid") if k in form}
    log.info("twilio call %s from %s: streaming to %s", form.get("CallSid"), form.get("From"), stream_url)
    return Response(connect_stream_twiml(stream_url, extra), media_type="application/xml")


async def twilio_stream(host: ServerState, cfg: TwilioConfig, ws: WebSocket) -> None:
    """One Twilio media stream: runs until ``stop``, disconnect, media timeout or server shutdown."""
    if not cfg.auth_token:
        log.warning("twilio stream accepted without a signature check: set TWILIO_AUTH_TOKEN")
    else:
        bases = _base_urls(cfg, ws.headers, "https" if ws.url.scheme == "wss" else "http")
        urls = [_ws_scheme(b) + _with_query(ws.url.path, ws.url.query) for b in bases]
        if not signature_ok(cfg.auth_token, ws.headers.get("x-twilio-signature"), urls):
            log.warning("twilio stream from %s: bad or missing X-Twilio-Signature", ws.client)
            await ws.close(code=1008)  # before accept: the handshake is refused with 403
            return
    await ws.accept()
    reason = unready_reason(host)
    if reason is not None:  # before a Session exists: it would have no pipeline to run on
        log.warning("twilio stream refused: %s", reason)
        with contextlib.suppress(Exception):
            await ws.close(code=CLOSE_TRY_AGAIN_LATER, reason=close_reason(reason))
        return
    choice = ws.query_params.get("duplex")
    duplex = choice in ("1", "true") if choice is not None else "phone" in host.cfg.duplex_surfaces
    if not duplex and host.cfg.duplex_only:  # ?duplex=0 on a server without a cascade
        log.warning("twilio stream refused: ?duplex=%s on a duplex-only server", choice)
        with contextlib.suppress(Exception):
            await ws.close(code=1008, reason=close_reason(DUPLEX_ONLY))  # 1008: policy (RFC 6455 §7.4.1)
        return
    if duplex:
        await _duplex_stream(host, cfg, ws)
        return
    bridge = TwilioBridge(
        new_call_id("tw"),
        host.responder,
        replace(host.cfg.session, failure_apology=FAILURE_APOLOGY),  # said when a reply fails
        ws.send_text,
        cfg.lead_ms,
        cfg.mark_ms,
        turn_model=host.turn_model,
        tool_runner=host.tool_runner,
    )
    call = TwilioCall(ws, bridge)
    try:
        host.admit(call)
    except Refused as e:
        log.warning("twilio stream refused: %s", e)
        await bridge.close("server full")
        await ws.close(code=CLOSE_TRY_AGAIN_LATER, reason=close_reason(str(e)))
        return
    await _receive(host, cfg, ws, call)


async def _duplex_stream(host: ServerState, cfg: TwilioConfig, ws: WebSocket) -> None:
    """A media stream on the duplex model (:mod:`.twilio_duplex`): without one, or with every engine row
    taken, the socket closes with 1013 "try again later" and the reason."""
    from omniduplex.app.host.duplex import DuplexFull

    service = host.duplex
    if service is None or service.engine is None:
        log.warning("twilio duplex stream refused: no duplex model")
        with contextlib.suppress(Exception):
            await ws.close(code=CLOSE_TRY_AGAIN_LATER, reason="no duplex model (serve --duplex-model)")
        return
    bridge = TwilioDuplexBridge(new_call_id("twd"), service, ws.send_text, cfg.mark_ms)
    call = TwilioCall(ws, bridge)
    try:
        host.admit(call)
    except Refused as e:
        log.warning("twilio duplex stream refused: %s", e)
        await ws.close(code=CLOSE_TRY_AGAIN_LATER, reason=close_reason(str(e)))
        return
    try:
        await bridge.open()
    except DuplexFull as e:
        host.release(call)
        log.warning("twilio duplex stream refused: %s", e)
        with contextlib.suppress(Exception):
            await ws.close(code=CLOSE_TRY_AGAIN_LATER, reason=close_reason(f"try again later: {e}"))
        return
    await _receive(host, cfg, ws, call)


async def _receive(host: ServerState, cfg: TwilioConfig, ws: WebSocket, call: TwilioCall) -> None:
    """Feed the stream's messages to the call's bridge until it ends; then close it and free its slot."""
    bridge = call.bridge
    reason = "stream stopped"
    try:
        while True:
            msg = await asyncio.wait_for(ws.receive(), timeout=cfg.media_timeout_s)
            if msg["type"] == "websocket.disconnect":
                reason = "twilio disconnected"
                break
            if not bridge.handle(msg.get("text") if msg.get("text") is not None else msg.get("bytes", b"")):
                break
    except asyncio.TimeoutError:
        reason = f"no message from twilio for {cfg.media_timeout_s:.0f} s"
    except (WebSocketDisconnect, RuntimeError):
        reason = "twilio disconnected"
    finally:
        try:
            await call.close(reason)
        finally:
            host.release(call)


def access(cfg: TwilioConfig) -> tuple[Access, ...]:
    """What the edge asks of the Twilio routes: nothing (they check ``X-Twilio-Signature`` themselves when an
    auth token is set); while API keys are required and no auth token is set, they are refused."""
    unsigned = None
    if cfg.auth_token is None:
        unsigned = "the Twilio webhooks need TWILIO_AUTH_TOKEN (signature checks) when API keys are required"
    return (
        Access("/phone/twilio/", "signed", unsigned=unsigned),
        Access(STREAM_PATH, "signed", connection=True, unsigned=unsigned),
    )


def router(host: ServerState, cfg: TwilioConfig) -> APIRouter:
    """The Twilio routes (``/phone/twilio/voice``, ``/phone/twilio/stream``) over ``host``."""
    r = APIRouter(prefix="/phone", tags=["phone"])

    @r.post("/twilio/voice")
    async def voice(request: Request) -> Response:
        return await twilio_voice(host, cfg, request)

    @r.websocket("/twilio/stream")
    async def stream(ws: WebSocket) -> None:
        await twilio_stream(host, cfg, ws)

    return r
