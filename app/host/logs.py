"""Server logging: plain lines, or one JSON object per line (``serve --log-json``) for log collectors.

A JSON line holds ``time`` (ISO 8601, UTC, ms), ``level``, ``logger``, ``message`` and, when known,
``session_id`` and ``turn_id`` (plus ``exc`` with the traceback text). The ids come from ``extra=`` on the
call, else from context variables that :func:`bind` sets: the server binds them as a session's events go by
(:func:`bind_event`), so every later record of that task, and of the tasks it starts, carries them.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import datetime, timezone

SESSION_ID: ContextVar[str | None] = ContextVar("omniduplex_session_id", default=None)
TURN_ID: ContextVar[str | None] = ContextVar("omniduplex_turn_id", default=None)
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def bind(session_id: str | None = None, turn_id: str | None = None) -> None:
    """Tag this context's later log records with ``session_id`` / ``turn_id`` (``None`` leaves one as is)."""
    if session_id is not None:
        SESSION_ID.set(session_id)
    if turn_id is not None:
        TURN_ID.set(turn_id)


def bind_event(ev) -> None:
    """Bind the ids a session event carries (any :class:`~omniduplex.app.core.events.SessionEvent`)."""
    bind(getattr(ev, "session_id", None) or None, getattr(ev, "turn_id", None) or None)


class ContextFilter(logging.Filter):
    """Sets ``record.session_id`` / ``record.turn_id`` from the context unless the call passed them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "session_id", None) is None:
            record.session_id = SESSION_ID.get()
        if getattr(record, "turn_id", None) is None:
            record.turn_id = TURN_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("session_id", "turn_id"):
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: str = "info", json_lines: bool = False, stream=None) -> logging.Handler:
    """Route every logger through one root handler on ``stream`` (default stderr): JSON lines or plain text,
    with the session/turn context; replaces the root's handlers. Returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(PLAIN_FORMAT))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("aioice").setLevel(max(logging.WARNING, root.level))
    return handler
