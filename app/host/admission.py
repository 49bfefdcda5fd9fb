"""Session slots of every surface in the server's session table (``ServerState.sessions``), next to the
WebRTC peers: phone calls, Realtime API connections.

Sharing the table means one ``max_sessions`` limit over every surface (they share one pipeline), every
session in ``/metrics``, and ``ServerState.stop`` closing them all at shutdown. A call is anything with
``id``, ``session`` (a :class:`~omniduplex.app.core.session.Session`) and ``async close(reason)``.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from typing import Protocol

from omniduplex.app.core.session import Session

log = logging.getLogger("omniduplex.slots")
_numbers = itertools.count(1)


class Call(Protocol):
    id: str
    session: Session

    async def close(self, reason: str) -> None: ...


class CallsFull(RuntimeError):
    """Every session slot of the server (or of the surface) is taken."""


def new_call_id(prefix: str) -> str:
    """A process-unique call id, e.g. ``tw3-5f2a9c`` (it prefixes the session's pipeline turn ids)."""
    return f"{prefix}{next(_numbers)}-{secrets.token_hex(3)}"


def admit(state, call: Call) -> None:
    """Take a session slot for ``call``.

    Raises:
        CallsFull: ``state.cfg.max_sessions`` sessions are open, or the server is draining.
    """
    if getattr(state, "draining", False):
        raise CallsFull("the server is shutting down (draining): no new sessions")
    if len(state.sessions) >= state.cfg.max_sessions:
        raise CallsFull(f"server is full: {len(state.sessions)} of {state.cfg.max_sessions} sessions in use")
    state.sessions[call.id] = call
    state.started_total += 1
    log.info("call %s admitted (%d/%d sessions)", call.id, len(state.sessions), state.cfg.max_sessions)


def release(state, call: Call) -> None:
    """Free ``call``'s slot and keep its session stats for ``/metrics``. Idempotent."""
    if state.sessions.pop(call.id, None) is not None:
        state.closed_stats.append(call.session.stats)
        del state.closed_stats[:-256]
        log.info("call %s released (%d/%d sessions)", call.id, len(state.sessions), state.cfg.max_sessions)
