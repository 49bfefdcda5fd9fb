"""Admission: the one place a session of any surface takes a slot in the server's session table
(``ServerState.sessions``) and gives it back.

Sharing the table means one ``max_sessions`` limit over every surface (they share one pipeline), every
session in ``/metrics``, and ``ServerState.stop`` closing them all at shutdown. A call is anything with
``id``, ``session`` (a :class:`~omniduplex.app.core.session.Session`) and ``async close(reason)``
(:class:`Call`): a WebRTC peer, a Realtime connection, a Twilio stream, a SIP call.

A surface checks :func:`~.readiness.unready_reason` before it builds anything (to answer in its own
protocol), then :func:`admit` takes the slot; :func:`admit` checks readiness again, so a stage that went
down in between is refused the same way.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from typing import TYPE_CHECKING, Protocol

from omniduplex.app.host.heap import release_free_memory
from omniduplex.app.host.readiness import unready_reason

if TYPE_CHECKING:
    from omniduplex.app.core.session import Session

log = logging.getLogger("omniduplex.admission")
_numbers = itertools.count(1)


class Call(Protocol):
    """One session of a surface, as the host holds it."""

    id: str
    session: Session

    async def close(self, reason: str) -> None: ...


class Refused(RuntimeError):
    """No session can be admitted now; ``str(e)`` says why, in one line for the client."""


class SessionFull(Refused):
    """Every session slot of the server is taken, or the server is draining."""


class NotReady(Refused):
    """The pipeline is starting, restarting after a crash, or failed to start."""


def new_call_id(prefix: str) -> str:
    """A process-unique call id, e.g. ``tw3-5f2a9c`` (it prefixes the session's pipeline turn ids)."""
    return f"{prefix}{next(_numbers)}-{secrets.token_hex(3)}"


def check(state) -> None:
    """Raise as :func:`admit` would for a new call of ``state`` (a ``ServerState``), taking no slot: a
    surface calls it before it builds a call that costs something (a peer connection).

    Raises:
        NotReady: the stages are starting, restarting or failed to start (:mod:`.readiness`).
        SessionFull: ``state.cfg.max_sessions`` sessions are open, or the server is draining.
    """
    reason = unready_reason(state)
    if reason is not None:
        raise NotReady(f"not ready, try again later: {reason}")
    if getattr(state, "draining", False):
        raise SessionFull("the server is shutting down (draining): no new sessions")
    if len(state.sessions) >= state.cfg.max_sessions:
        raise SessionFull(
            f"server is full: {len(state.sessions)} of {state.cfg.max_sessions} sessions in use"
        )


def admit(state, call: Call) -> None:
    """Take a session slot of ``state`` (a ``ServerState``) for ``call``.

    Raises:
        NotReady / SessionFull: as :func:`check`.
    """
    check(state)
    state.sessions[call.id] = call
    state.started_total += 1
    log.info("call %s admitted (%d/%d sessions)", call.id, len(state.sessions), state.cfg.max_sessions)


def release(state, call: Call) -> bool:
    """Free ``call``'s slot, keep its session stats for ``/metrics`` and give freed heap back to the OS
    (:mod:`.heap`); ``False`` when it held none (idempotent)."""
    if state.sessions.pop(call.id, None) is None:
        return False
    state.closed_stats.append(call.session.stats)
    del state.closed_stats[:-256]
    log.info("call %s released (%d/%d sessions)", call.id, len(state.sessions), state.cfg.max_sessions)
    release_free_memory()
    return True
