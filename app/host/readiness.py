"""Whether the server can take a new session now, and why not: one answer that every surface turns into its
own protocol's "try again later".

``serve`` starts the stages in the background (``/healthz`` answers at once, ``/readyz`` is 503 until every
stage is up), and a crashed stage is restarted while the others run (``/readyz`` 503 again meanwhile). A new
session in either window would have no pipeline to run on, so each surface checks :func:`unready_reason`
*before* it creates a session, and answers:

======================  =====================================================================================
surface                 answer while not ready
======================  =====================================================================================
``/v1/realtime``        the WebSocket is accepted, one ``error`` event (``type: server_error``, ``code:
                        server_not_ready``, ``message``: the reason) is sent, then a close with code 1013
                        ("try again later", RFC 6455 §7.4.1 / IANA registry). Refused, not held: a held
                        socket would need its own timeout and keeps a client from trying another replica.
Twilio webhook          ``POST /phone/twilio/voice``: 503 with ``Retry-After`` and the reason (Twilio then
                        plays its fallback URL or retries, per the webhook docs).
Twilio media stream     accepted and closed with 1013 and the reason.
WebRTC ``POST /offer``  503 ``{"error": reason, "status"}`` with ``Retry-After``.
SIP INVITE              ``503 Service Unavailable`` with ``Retry-After`` and ``Warning: 399 … "reason"``
                        (RFC 3261 §21.5.4, §20.33, §20.43).
``/readyz``             503 ``{"status", "reason", "stages"}`` (:func:`readiness`).
======================  =====================================================================================

Sessions already open are not touched: a restarting stage fails only the turns that were in it.
"""

from __future__ import annotations

RETRY_AFTER_S = 5
"""What ``Retry-After`` says while the server is not ready (s): stages start or restart in seconds."""
NOT_READY_CODE = "server_not_ready"
"""The Realtime ``error`` event's ``code`` while not ready."""
CLOSE_TRY_AGAIN_LATER = 1013
"""WebSocket close code "Try Again Later" (IANA WebSocket close code registry)."""


def _stats(orchestrator) -> dict:
    """The backend's ``stats()``; ``{}`` while there is no backend yet (models still loading) or its gauges
    cannot be read."""
    backend = getattr(orchestrator, "backend", None)
    try:
        return dict(backend.stats()) if backend is not None else {}
    except Exception:  # gauges of a backend that is being built or torn down
        return {}


def stage_states(orchestrator) -> dict[str, str]:
    """Stage → ``"up"``, ``"starting"`` or ``"restarting"`` (after a crash), from the backend's ``stats()``;
    ``{}`` while there is no backend yet (models still loading) or its gauges cannot be read."""
    stats = _stats(orchestrator)
    up, restarts = dict(stats.get("up", {})), dict(stats.get("restarts", {}))
    return {s: "up" if ok else "restarting" if restarts.get(s) else "starting" for s, ok in up.items()}


def _late(orchestrator) -> str:
    """`` (past the N s start limit: still waiting)`` when a stage missed the start limit, else ``""``."""
    stats = _stats(orchestrator)
    if not any(dict(stats.get("late", {})).values()):
        return ""
    return f" (past the {stats.get('start_timeout_s', 0):g} s start limit: still waiting)"


def readiness(state) -> dict:
    """The ``/readyz`` body for ``state`` (a ``ServerState``): ``status`` ``ready`` | ``starting`` |
    ``degraded`` (a stage restarting after a crash) | ``failed`` (the start failed; ``error``) | ``draining``;
    when not ready, ``reason`` (one line) and ``stages`` (:func:`stage_states`, when known)."""
    if getattr(state, "draining", False):
        return {
            "status": "draining",
            "reason": "the server is shutting down: no new sessions",
            "sessions": len(state.sessions),
        }
    if state.ready:
        return {"status": "ready"}
    if state.start_error is not None:
        err = f"{state.start_error}"
        return {"status": "failed", "reason": f"the pipeline failed to start: {err}", "error": err}
    stages = stage_states(state.orchestrator)
    if not state.started:
        waiting = [s for s, st in stages.items() if st != "up"]
        reason = (
            f"the server is starting: stage(s) {', '.join(waiting)} not up yet{_late(state.orchestrator)}"
            if waiting
            else "the server is starting: loading models"
        )
        return {"status": "starting", "reason": reason, "stages": stages}
    down = [s for s, st in stages.items() if st != "up"]
    reason = f"stage(s) {', '.join(down)} restarting after a crash" if down else "the pipeline is not ready"
    return {"status": "degraded", "reason": reason, "stages": stages}


def unready_reason(state) -> str | None:
    """Why no session can start now (the stages are starting, restarting, or failed to start), or ``None``
    when the server is ready. Draining is not checked here: :func:`omniduplex.app.host.admission.admit`
    refuses it."""
    if getattr(state, "ready", True):
        return None
    return readiness(state)["reason"]


def close_reason(text: str) -> str:
    """``text`` cut to fit a WebSocket close frame's reason (123 bytes of UTF-8, RFC 6455 §5.5.1)."""
    return text.encode("utf-8")[:120].decode("utf-8", "ignore")
