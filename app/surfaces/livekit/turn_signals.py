"""Which ``input_speech_started`` / ``input_speech_stopped`` events the framework gets (pure policy).

The framework reads server-side turn detection from two events (``voice/agent_activity.py``):
``input_speech_started`` sets the user state to *speaking* and **interrupts the agent's speech at once**;
``input_speech_stopped`` sets it back to *listening*. Our session is the authority on turn-taking: speech
over a playing reply only interrupts after ``barge_in_ms`` of voice (a cough does not), and a segment
shorter than ``min_turn_ms`` is noise, not a turn. So:

* speech opening while no reply plays → ``started`` at once;
* speech opening over a reply → held; it becomes ``started`` when the session declares a barge-in, and is
  never reported if it stays below the barge-in threshold and ends;
* a committed user turn → ``stopped`` (preceded by ``started`` if that was held, e.g. the reply ended
  while the user was still talking);
* a reported segment that ends without becoming a turn (noise, or dropped by ``clear_audio``) →
  ``stopped`` without transcription, so the user state does not stay *speaking*.
"""

from __future__ import annotations

from typing import Literal

Signal = Literal["started", "stopped", "stopped_no_transcript"]


class SpeechSignals:
    """Tracks whether the open speech segment has been reported to the framework."""

    def __init__(self) -> None:
        self.reported = False

    def speech_started(self, replying: bool) -> list[Signal]:
        """The session's VAD opened a segment; ``replying``: a reply is playing (not yet interrupted)."""
        if replying:
            self.reported = False
            return []
        self.reported = True
        return ["started"]

    def barge_in(self) -> list[Signal]:
        """User speech interrupted the reply (``BargeIn`` from the VAD, not a programmatic cancel)."""
        if self.reported:
            return []
        self.reported = True
        return ["started"]

    def committed(self) -> list[Signal]:
        """The segment became a user turn."""
        out: list[Signal] = [] if self.reported else ["started"]
        self.reported = False
        return [*out, "stopped"]

    def dropped(self) -> list[Signal]:
        """The segment ended without becoming a turn."""
        if not self.reported:
            return []
        self.reported = False
        return ["stopped_no_transcript"]
