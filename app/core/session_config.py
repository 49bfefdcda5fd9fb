"""A session's settings (:class:`SessionConfig`), the options a surface may change on a live session
(:data:`OPTIONS`), and its measurements (:class:`SessionStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omniduplex.app.core.vad import TurnConfig

FAILURE_APOLOGY = "Sorry, something went wrong on my side. Could you say that again?"
"""What a voice surface says when a reply fails (``SessionConfig.failure_apology``)."""


@dataclass
class SessionConfig:
    """Per-session settings. ``output_rate``: rate of :meth:`Session.pull_audio` (Hz).

    ``user_text``: what the history records for a spoken user turn until (or unless) the pipeline sends
    its transcript; ``{seconds}`` is replaced by the turn's speech length. ``instructions``: this
    session's system prompt (``None`` = the server's). ``voice``: the voice its replies ask the TTS for
    (Realtime ``session.audio.output.voice``; a Qwen3-TTS stage speaks a speaker of that name, any other
    TTS ignores it; ``None`` = the server's). ``auto_respond``: a turn committed by the VAD
    starts its reply at once (else it waits for :meth:`Session.respond`). ``vad_commit``: the VAD
    commits turns (``False``: only :meth:`Session.commit_audio` does, as with the Realtime API's
    ``turn_detection: null``; speech events and barge-in still follow the VAD). ``tools`` / ``tool_choice``:
    the function tools every reply is offered and how it may use them (:mod:`~omniduplex.app.core.tools`;
    a reply may override them; ``None`` = none, or a server-side runner's). ``failure_apology``: words said
    when a reply fails in the pipeline (:data:`FAILURE_APOLOGY` on the voice surfaces: browser, kiosk,
    phone); the reply still ends with reason ``error``. ``None``: nothing is said (the Realtime API reports
    the failure to its client instead).
    """

    turn: TurnConfig = field(default_factory=TurnConfig)
    output_rate: int = 48000
    vad_aggressiveness: int = 2
    history_entries: int = 16
    user_text: str = "[spoken turn, {seconds:.1f} s]"
    instructions: str | None = None
    voice: str | None = None
    auto_respond: bool = True
    vad_commit: bool = True
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    failure_apology: str | None = None


OPTIONS = ("instructions", "voice", "auto_respond", "vad_commit", "tools", "tool_choice")
"""The :class:`SessionConfig` fields a surface may change on a live session (:meth:`Session.set_options`)."""


@dataclass
class SessionStats:
    """Measurements of a session, one entry per event (ms)."""

    turns: int = 0
    barge_ins: int = 0
    latency_ms: list[float] = field(default_factory=list)
    stop_ms: list[float] = field(default_factory=list)
