"""Routes of the OpenAI Realtime API (GA) surface: ``ws /v1/realtime`` (one :class:`~.connection
.RealtimeConnection` per socket) and ``POST /v1/realtime/client_secrets``.

Connecting before the server is ready (stages starting, or a crashed stage restarting; ``/readyz`` 503): the
``/v1/realtime`` WebSocket is accepted, gets one ``error`` event (``type: server_error``, ``code:
server_not_ready``, ``message``: which stage is starting or restarting) and is closed with code 1013 ("try
again later"); no session is created. The client is refused rather than held until ready, so it can retry
with backoff or go to another replica (the LiveKit remote plugin retries). A full or draining server answers
the same way with ``code: session_limit_reached``. See :mod:`omniduplex.app.host.readiness`.

``ws /v1/realtime?duplex=1`` (a server started with ``--duplex-model``): the full-duplex mode over the frame
engine (:mod:`.duplex`), with the same auth, limits and refusals; a full engine (every row taken) is refused
like a full server (``session_limit_reached``, close 1013). Without a duplex model it is refused with
``code: duplex_unavailable``. On a duplex-only server (``serve --model MOSHI_DIR``) plain ``/v1/realtime`` is
the duplex mode too, and ``?duplex=0`` is refused with ``code: cascade_unavailable`` (close 1008).
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel

from omniduplex.app.host.admission import NotReady, Refused, new_call_id
from omniduplex.app.host.auth import Access
from omniduplex.app.host.config import DUPLEX_ONLY
from omniduplex.app.host.readiness import CLOSE_TRY_AGAIN_LATER, NOT_READY_CODE, close_reason, unready_reason
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.realtime.connection import RealtimeConnection
from omniduplex.app.surfaces.realtime.duplex import DuplexConnection
from omniduplex.app.surfaces.wire.openai_rest import MODEL_ID, error_response
from omniduplex.app.surfaces.wire.realtime import server_events as ev

log = logging.getLogger("omniduplex.realtime")

CLIENT_SECRET_TTL_S = 600
"""Default lifetime of a ``/v1/realtime/client_secrets`` token (s; the API's default is 600)."""
FULL_CODE = "session_limit_reached"
"""The ``error`` event's ``code`` when the server is full or draining."""


class _RealtimeCall:
    """A realtime connection in the host's session table (:mod:`omniduplex.app.host.admission`)."""

    def __init__(self, ws: WebSocket, conn: RealtimeConnection) -> None:
        self.ws, self.conn, self.id, self.session = ws, conn, conn.session.id, conn.session

    async def close(self, reason: str) -> None:
        await self.session.close(reason)
        with contextlib.suppress(Exception):  # already closed
            await self.ws.close(code=1001, reason=reason[:120])


async def _refuse(ws: WebSocket, message: str, code: str, close: int = CLOSE_TRY_AGAIN_LATER) -> None:
    """One ``error`` event (``server_error``/``code``), then close ``close`` (1013 "try again later")."""
    with contextlib.suppress(Exception):  # the client may already be gone
        await ws.send_text(ev.error(message, code=code, type="server_error").model_dump_json())
        await ws.close(code=close, reason=close_reason(message))


class ClientSecretRequest(BaseModel):
    """``POST /v1/realtime/client_secrets`` body: ``expires_after {anchor, seconds}`` and a ``session`` config
    applied when the browser connects with the token."""

    expires_after: dict | None = None
    session: dict | None = None


ACCESS = (Access("/v1/realtime", connection=True),)
"""What the edge asks of these routes: an API key or token (each counts as a new connection)."""


def router(host: ServerState) -> APIRouter:
    """The Realtime routes over ``host``."""
    r = APIRouter(tags=["realtime"])

    @r.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        """The GA Realtime API over a WebSocket (``?model=`` accepted and ignored: the server's pipeline)."""
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        reason = unready_reason(host)
        if reason is not None:  # before a Session exists: it would have no pipeline to run on
            log.info("realtime connection refused: %s", reason)
            await _refuse(ws, reason, NOT_READY_CODE)
            return
        choice = ws.query_params.get("duplex")
        if choice in ("1", "true") or (host.cfg.duplex_only and choice is None):
            await _duplex(ws)
            return
        if host.cfg.duplex_only:  # ?duplex=0 on a server without a cascade
            await _refuse(ws, DUPLEX_ONLY, "cascade_unavailable", 1008)  # 1008: policy, not "try again"
            return
        conn = RealtimeConnection(
            ws, new_call_id("rt"), host.responder, host.cfg.session, host.smart_turn_model, mcp=host.mcp
        )
        call = _RealtimeCall(ws, conn)
        try:
            host.admit(call)
        except Refused as e:
            await _refuse(ws, str(e), NOT_READY_CODE if isinstance(e, NotReady) else FULL_CODE)
            await conn.session.close("server full")
            return
        try:
            await conn.run()
        finally:
            host.release(call)

    async def _duplex(ws: WebSocket) -> None:
        from omniduplex.app.host.duplex import DuplexFull

        service = host.duplex
        if service is None or service.engine is None:
            await _refuse(
                ws, "this server has no duplex model (serve --duplex-model DIR)", "duplex_unavailable"
            )
            return
        conn = DuplexConnection(ws, new_call_id("dx"), service)
        call = _RealtimeCall(ws, conn)
        try:
            host.admit(call)
        except Refused as e:
            await _refuse(ws, str(e), NOT_READY_CODE if isinstance(e, NotReady) else FULL_CODE)
            return
        try:
            await conn.run()
        except DuplexFull as e:
            await _refuse(ws, f"try again later: {e}", FULL_CODE)
        finally:
            host.release(call)

    @r.post("/v1/realtime/client_secrets")
    async def client_secrets(body: ClientSecretRequest):
        """Mint a short-lived token a browser uses instead of an API key (``Authorization: Bearer ek_…``)."""
        ttl = int((body.expires_after or {}).get("seconds", CLIENT_SECRET_TTL_S))
        if not 10 <= ttl <= 7200:
            return error_response(
                400, "expires_after.seconds must be between 10 and 7200", "invalid_value", "expires_after"
            )
        value, expires_at = host.tokens.mint(ttl)
        session = {
            "type": "realtime",
            "object": "realtime.session",
            "model": MODEL_ID,
            **(body.session or {}),
        }
        return {"value": value, "expires_at": expires_at, "session": session}

    return r
