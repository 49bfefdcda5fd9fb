"""HTTP routes of the browser voice chat (and of the kiosk page's media): WebRTC signalling.

Routes:
    ``POST /offer``      ``{"sdp", "type": "offer", "duplex"?}`` → ``{"sdp", "type": "answer", "session_id",
                         "duplex"}``; ``duplex`` true runs the duplex model (``serve --duplex-model``) instead
                         of the cascade (absent: ``?duplex=1`` on the URL, else whether ``--duplex-surfaces``
                         names ``browser``); 400 when the server has none, 503 when its engine is full;
                         400 with ``{"error"}`` for a bad offer, 503 when ``max_sessions`` are open, and 503
                         with ``{"error": reason, "status"}`` and ``Retry-After`` while the stages start or
                         restart (:mod:`omniduplex.app.host.readiness`).
    ``DELETE /sessions/{id}``, ``POST /sessions/{id}/bye``  hang up a session (the page also says
                         ``bye`` on the data channel).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omniduplex.app.core.session_config import FAILURE_APOLOGY
from omniduplex.app.host.admission import NotReady, SessionFull, check, new_call_id
from omniduplex.app.host.auth import Access
from omniduplex.app.host.config import DUPLEX_ONLY
from omniduplex.app.host.readiness import RETRY_AFTER_S, readiness
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.browser.webrtc import OfferError, PeerSession, check_offer

log = logging.getLogger("omniduplex.server")


@dataclass
class PeerOptions:
    """A browser session's settings beyond the host's: ``greeting`` (what a ``{"type": "greet"}`` message has
    the assistant say), ``media_timeout_s`` / ``connect_timeout_s`` (close without client audio, s)."""

    greeting: str = "Hello! How can I help?"
    media_timeout_s: float = 5.0
    connect_timeout_s: float = 20.0


async def open_peer(
    host: ServerState, sdp: str, opts: PeerOptions, duplex: bool = False
) -> tuple[str, str]:
    """Answer an offer with a new session (on the duplex model when ``duplex``); returns ``(session_id,
    answer_sdp)``.

    Raises:
        NotReady / SessionFull: no session can be admitted now (:mod:`omniduplex.app.host.admission`); a full
            duplex engine is a SessionFull too.
        OfferError: the offer cannot be answered, or ``duplex`` on a server without a duplex model.
    """
    from omniduplex.app.host.duplex import DuplexFull

    check(host)  # before a peer connection and its session exist
    if duplex and (host.duplex is None or host.duplex.engine is None):
        raise OfferError("this server has no duplex model (serve --duplex-model DIR)")
    if not duplex and host.cfg.duplex_only:
        raise OfferError(DUPLEX_ONLY)
    sid = new_call_id("s")
    peer = PeerSession(
        sid,
        host.responder,
        replace(host.cfg.session, failure_apology=FAILURE_APOLOGY),  # said when a reply fails
        _closed(host),
        opts.media_timeout_s,
        opts.connect_timeout_s,
        host.turn_model,
        opts.greeting,
        host.tool_runner,
        host.duplex if duplex else None,
    )
    try:
        host.admit(peer)  # take the slot before awaiting, so concurrent offers count it
    except (NotReady, SessionFull):
        await peer.close("refused")
        raise
    try:
        answer = await peer.answer(sdp)
    except DuplexFull as e:
        host.release(peer)
        raise SessionFull(f"try again later: {e}") from None
    except Exception:
        host.release(peer)
        raise
    log.info("session %s opened (%d/%d)", sid, len(host.sessions), host.cfg.max_sessions)
    return sid, answer


def wants_duplex(field: object, query: str | None, host: ServerState) -> bool:
    """Whether an offer runs the duplex model: its ``duplex`` field (a bool), else ``?duplex=`` (``1`` /
    ``true`` / ``0`` / ``false``), else whether ``serve --duplex-surfaces`` names ``browser`` (always on a
    duplex-only server: ``serve --model MOSHI_DIR``, where an offer asking for the cascade is refused).

    Raises:
        OfferError: a ``duplex`` field that is not a bool, or a query value not in those four."""
    if field is not None:
        if not isinstance(field, bool):
            raise OfferError(f"'duplex' must be true or false, got {field!r}")
        return field
    if query is not None:
        if query not in ("1", "true", "0", "false"):
            raise OfferError(f"?duplex= must be 1, true, 0 or false, got {query!r}")
        return query in ("1", "true")
    return "browser" in host.cfg.duplex_surfaces


def _closed(host: ServerState):
    async def closed(peer: PeerSession) -> None:
        host.release(peer)

    return closed


ACCESS = (Access("/offer", connection=True), Access("/sessions/"))
"""What the edge asks of these routes: an API key or token (``/offer`` opens a session)."""


def router(host: ServerState, opts: PeerOptions) -> APIRouter:
    """The signalling routes over ``host`` (see the module docstring)."""
    r = APIRouter(tags=["browser"])

    @r.post("/offer")
    async def offer(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": 'body must be JSON: {"sdp": ..., "type": "offer"}'}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "body must be a JSON object with 'sdp' and 'type'"}, 400)
        try:
            sdp = check_offer(body.get("sdp"), body.get("type"))
            duplex = wants_duplex(body.get("duplex"), request.query_params.get("duplex"), host)
            sid, answer = await open_peer(host, sdp, opts, duplex)
        except NotReady as e:
            retry = {"Retry-After": str(RETRY_AFTER_S)}
            return JSONResponse({"error": str(e), "status": readiness(host)["status"]}, 503, headers=retry)
        except SessionFull as e:
            return JSONResponse({"error": str(e), "max_sessions": host.cfg.max_sessions}, 503)
        except OfferError as e:
            return JSONResponse({"error": f"bad offer: {e}"}, 400)
        return {"sdp": answer, "type": "answer", "session_id": sid, "duplex": duplex}

    @r.delete("/sessions/{session_id}")
    @r.post("/sessions/{session_id}/bye")  # navigator.sendBeacon on page unload
    async def hang_up(session_id: str):
        call = host.sessions.get(session_id)
        if call is None:
            return JSONResponse({"error": f"no session {session_id!r}"}, 404)
        await call.close("client hung up")
        return {"closed": session_id}

    return r
