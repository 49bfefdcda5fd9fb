"""A spoken welcome: the assistant greets a visitor who has just walked up (the kiosk's attract screen,
a browser page's ``{"type": "greet"}`` message). It is an ordinary typed turn, :data:`VISITOR_OPENER`,
answered with per-reply instructions that ask for the greeting."""

from __future__ import annotations

from omniduplex.app.core.session import Session

VISITOR_OPENER = "Hello!"
"""The user message a greeting answers: what a visitor walking up would say."""


def greeting_instructions(greeting: str) -> str:
    """Per-reply instructions that make the assistant welcome a visitor with (about) ``greeting``."""
    return f'A visitor has just walked up to this voice kiosk. Greet them by saying: "{greeting.strip()}"'


def speak_greeting(session: Session, greeting: str) -> str | None:
    """Have ``session`` greet a visitor: a typed turn (:data:`VISITOR_OPENER`) answered with
    :func:`greeting_instructions`. Returns the reply's turn id; ``None`` when a reply is already in flight
    (the visitor is being answered) or the session is closed."""
    if session.closed or session.reply_turn_id is not None:
        return None
    session.add_user_text(VISITOR_OPENER)
    return session.respond(instructions=greeting_instructions(greeting), metadata={"kiosk": "greeting"})
