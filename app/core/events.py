"""The session ↔ transport contract: typed events a :class:`~omniduplex.app.core.session.Session` emits.

A transport forwards them to its client (the WebRTC transport sends :meth:`SessionEvent.to_json`
on the data channel) and may log them. Times are milliseconds; ``*_at_ms`` fields are on the
session clock (ms since the session started), durations are plain ms.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

from omniduplex.pipeline.events import CallEvent

EventType = Literal[
    "session_started",
    "user_speech_started",
    "user_turn_committed",
    "user_transcript",
    "user_transcript_partial",
    "reply_started",
    "reply_text",
    "tool_call",
    "function_call_output",
    "reply_audio_started",
    "reply_spoken",
    "barge_in",
    "reply_ended",
    "session_error",
    "session_closed",
]


EndReason = Literal["completed", "interrupted", "error", "closed"]
"""Why a reply ended: all of it was played, the user barged in, it failed, or the session closed."""


@dataclass
class SessionEvent:
    """Base of every session event; ``type`` names it on the wire."""

    type: ClassVar[EventType]
    session_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


@dataclass
class SessionStarted(SessionEvent):
    """The session is ready; ``config`` holds its turn-taking thresholds (ms)."""

    type: ClassVar[EventType] = "session_started"
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class UserSpeechStarted(SessionEvent):
    """The VAD opened a speech segment at ``at_ms``."""

    type: ClassVar[EventType] = "user_speech_started"
    at_ms: float = 0.0


@dataclass
class UserTurnCommitted(SessionEvent):
    """Endpointing closed a segment and sent it to the pipeline as turn ``turn_id``.

    ``audio_ms``: length of the submitted audio; ``speech_ms``: voiced part of it;
    ``speech_end_at_ms``: when the last voiced frame arrived (end of user speech).
    """

    type: ClassVar[EventType] = "user_turn_committed"
    turn_id: str = ""
    audio_ms: float = 0.0
    speech_ms: float = 0.0
    speech_end_at_ms: float = 0.0
    text: str = ""


@dataclass
class UserTranscriptEvent(SessionEvent):
    """The ASR stage's transcript of turn ``turn_id`` (user captions); ``text`` "" = no words heard, and
    then no reply is generated. ``words``: ``[word, start_s, end_s]`` within the turn's audio."""

    type: ClassVar[EventType] = "user_transcript"
    turn_id: str = ""
    text: str = ""
    words: list[Any] = field(default_factory=list)


@dataclass
class UserTranscriptPartial(SessionEvent):
    """What the ASR has heard so far of turn ``turn_id`` while the user still speaks (live captions); the
    turn's :class:`UserTranscriptEvent` follows and is the final word.

    ``text``: the whole partial transcript (replaces the previous one; its last words may still change);
    ``stable``: its prefix that will not change; ``delta``: the words added to the agreed prefix since the
    last partial (the prefix two successive partials agree on, or ``stable``): the deltas of a turn joined
    are a growing, never revised prefix, as Realtime ``input_audio_transcription.delta`` events carry it
    ("" when nothing was added).
    """

    type: ClassVar[EventType] = "user_transcript_partial"
    turn_id: str = ""
    text: str = ""
    stable: str = ""
    delta: str = ""


@dataclass
class ReplyStarted(SessionEvent):
    """A reply to ``turn_id`` started in the pipeline (``metadata``: what :meth:`Session.respond` was
    given, echoed by the Realtime API's ``response.created``)."""

    type: ClassVar[EventType] = "reply_started"
    turn_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReplyText(SessionEvent):
    """A transcript delta of the assistant's reply to ``turn_id``."""

    type: ClassVar[EventType] = "reply_text"
    turn_id: str = ""
    text: str = ""


@dataclass
class ToolCall(SessionEvent):
    """A function call of the reply to ``turn_id``, as the model makes it (never spoken): ``call`` is the
    call's event itself — :class:`~omniduplex.pipeline.events.CallStarted` (call ``index`` of function
    ``name``), ``CallArgumentsDelta`` (more of its arguments), ``CallDone`` (complete, a JSON object as a
    string, and in the history as its ``function_call`` entry) or ``CallFailed`` (cut off or malformed: not
    recorded, not run) — the one shape a call keeps from the LLM stage to here. ``run_here`` (on ``done``):
    the session runs it (a server-side :class:`~omniduplex.app.core.tools.ToolRunner`); else its client
    must add the output. On the wire (:meth:`to_dict`) the call's fields are flat, with its ``phase``."""

    type: ClassVar[EventType] = "tool_call"
    turn_id: str = ""
    call: CallEvent | None = None
    run_here: bool = False

    def to_dict(self) -> dict[str, Any]:
        call = asdict(self.call) if self.call is not None else {}
        call.pop("request_id", None)
        phase = self.call.phase if self.call is not None else ""
        out = {"type": self.type, "session_id": self.session_id, "turn_id": self.turn_id, "phase": phase}
        return {**out, **call, "run_here": self.run_here}


@dataclass
class FunctionCallOutput(SessionEvent):
    """A server-run call returned: ``output`` is in the history (``function_call_output``); ``error``: the
    runner failed (``output`` is then ``{"error": ...}``); ``duration_ms``: how long the runner took."""

    type: ClassVar[EventType] = "function_call_output"
    turn_id: str = ""
    call_id: str = ""
    name: str = ""
    output: str = ""
    error: bool = False
    duration_ms: float = 0.0


@dataclass
class ReplyAudioStarted(SessionEvent):
    """The first reply audio frame left the session for ``turn_id``.

    ``latency_ms``: end of user speech → first reply audio (includes the endpointing silence);
    ``commit_to_audio_ms``: turn committed → first reply audio (pipeline TTFP + playout pacing).
    """

    type: ClassVar[EventType] = "reply_audio_started"
    turn_id: str = ""
    latency_ms: float = 0.0
    commit_to_audio_ms: float = 0.0


@dataclass
class ReplySpoken(SessionEvent):
    """The audio of ``text`` (one aligned chunk of the reply to ``turn_id``, a clause for the cascade's TTS)
    started playing at ``at_ms`` of the reply's audio: captions shown in step with what is heard."""

    type: ClassVar[EventType] = "reply_spoken"
    turn_id: str = ""
    text: str = ""
    at_ms: float = 0.0


@dataclass
class BargeIn(SessionEvent):
    """User speech of ``speech_ms`` interrupted the reply to ``turn_id``; playout was flushed."""

    type: ClassVar[EventType] = "barge_in"
    turn_id: str = ""
    speech_ms: float = 0.0
    played_ms: float = 0.0


@dataclass
class ReplyEnded(SessionEvent):
    """The reply to ``turn_id`` is over.

    ``reason``: ``completed`` (all audio played), ``interrupted`` (barge-in), ``error``, ``closed``.
    ``played_ms`` / ``generated_ms``: reply audio sent to the client / received from the pipeline.
    ``text``: everything the pipeline produced; ``kept_text``: what the history keeps (truncated on
    barge-in to what was played: :func:`~omniduplex.app.core.history.truncate_aligned` when the audio chunks
    carry their text, else :func:`~omniduplex.app.core.history.truncate_reply`). ``stop_ms`` (interrupted
    only): barge-in detection → the first outbound frame without reply audio.
    """

    type: ClassVar[EventType] = "reply_ended"
    turn_id: str = ""
    reason: EndReason = "completed"
    played_ms: float = 0.0
    generated_ms: float = 0.0
    text: str = ""
    kept_text: str = ""
    stop_ms: float | None = None
    error: str = ""


@dataclass
class SessionError(SessionEvent):
    """Something failed that the client should know about (the session goes on)."""

    type: ClassVar[EventType] = "session_error"
    message: str = ""


@dataclass
class SessionClosed(SessionEvent):
    """The session ended (``reason``: client hang-up, media timeout, server shutdown)."""

    type: ClassVar[EventType] = "session_closed"
    reason: str = ""
