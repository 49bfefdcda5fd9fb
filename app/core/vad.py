"""Voice activity on 20 ms frames and the turn-taking policy built on it.

Two pieces, one job each:

* :class:`WebRtcVad` — is this 20 ms frame (16 kHz mono, 320 samples) speech? (webrtcvad).
* :class:`SpeechSegmenter` — pure state machine over those per-frame decisions: when a speech
  segment starts, how many milliseconds of speech it holds, and when it ends (endpointing). It
  counts audio time (frames × 20 ms), never wall time, so it is deterministic under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from omniduplex.app.core.audio.pcm import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, to_int16


class FrameVad(Protocol):
    """Per-frame speech decision on one 20 ms, 16 kHz mono int16 frame."""

    def is_speech(self, frame: np.ndarray) -> bool: ...


class WebRtcVad:
    """webrtcvad (the WebRTC GMM VAD). ``aggressiveness`` 0 (permissive) … 3 (strict)."""

    def __init__(self, aggressiveness: int = 2) -> None:
        import webrtcvad

        if not 0 <= aggressiveness <= 3:
            raise ValueError(f"vad aggressiveness must be 0..3, got {aggressiveness}")
        self.vad = webrtcvad.Vad(aggressiveness)

    def is_speech(self, frame: np.ndarray) -> bool:
        pcm = to_int16(frame)
        if pcm.shape != (FRAME_SAMPLES,):
            raise ValueError(f"vad frame must be {FRAME_SAMPLES} samples (20 ms at 16 kHz), got {pcm.shape}")
        return bool(self.vad.is_speech(pcm.tobytes(), SAMPLE_RATE))


@dataclass
class TurnConfig:
    """Turn-taking thresholds, all in milliseconds of input audio.

    Attributes:
        start_ms: consecutive voiced audio that opens a speech segment.
        endpoint_ms: trailing silence that closes it (endpointing; commits a user turn).
        barge_in_ms: voiced audio in a segment, while the assistant is replying, that interrupts it.
        min_turn_ms: voiced audio a segment needs to become a user turn (shorter ones are noise).
        max_turn_ms: a segment this long is committed even without silence.
        preroll_ms: audio kept from before the segment opened (the onset the VAD needed to decide).
        turn_detection: what ends a user turn: ``"silence"`` (``endpoint_ms`` of silence) or ``"smart"``
            (the Smart Turn model asked after ``smart_check_ms`` of silence; see
            :class:`~omniduplex.app.core.turn_detection.EndOfTurnPolicy`).
        smart_check_ms: trailing silence after which the model is asked whether the turn is complete.
        smart_max_silence_ms: trailing silence that ends the turn whatever the model said.
        smart_threshold: probability (0–1) at or above which the model's "complete" ends the turn.
        preemptive_ms: trailing silence after which the reply to the segment so far is started before
            the turn has ended (preemptive generation, LiveKit Agents' ``preemptive_generation``): held back
            until the turn ends with the same audio and context, cancelled if speech resumes; 0 = off.
    """

    start_ms: int = 60
    endpoint_ms: int = 500
    barge_in_ms: int = 300
    min_turn_ms: int = 200
    max_turn_ms: int = 20000
    preroll_ms: int = 200
    turn_detection: Literal["silence", "smart"] = "silence"
    smart_check_ms: int = 200
    smart_max_silence_ms: int = 2000
    smart_threshold: float = 0.5
    preemptive_ms: int = 200

    def __post_init__(self) -> None:
        positive = ("start_ms", "endpoint_ms", "barge_in_ms", "min_turn_ms", "max_turn_ms", "smart_check_ms")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 ms")
        if self.preroll_ms < 0:
            raise ValueError("preroll_ms must be >= 0 ms")
        if self.preemptive_ms < 0 or self.preemptive_ms % FRAME_MS:
            raise ValueError(f"preemptive_ms must be 0 (off) or a positive multiple of {FRAME_MS} ms")
        if self.turn_detection not in ("silence", "smart"):
            raise ValueError(f"turn_detection must be 'silence' or 'smart', got {self.turn_detection!r}")
        if self.smart_max_silence_ms <= self.smart_check_ms:
            raise ValueError("smart_max_silence_ms must be > smart_check_ms")
        if not 0.0 <= self.smart_threshold <= 1.0:
            raise ValueError(f"smart_threshold must be in [0, 1], got {self.smart_threshold}")


SegmentEvent = Literal["start", "end"]


class SpeechSegmenter:
    """Speech segments from per-frame VAD decisions (pure; 20 ms per :meth:`update`).

    ``start`` after ``start_ms`` of consecutive voiced frames; ``end`` after ``endpoint_ms`` of
    consecutive unvoiced frames inside a segment, or when it reaches ``max_turn_ms``.
    ``speech_ms`` is the voiced audio of the open segment (short pauses do not reset it).
    ``endpoint_ms`` (ms) overrides ``cfg.endpoint_ms`` (smart turn detection ends segments earlier
    through :meth:`end` and leaves only its longer fallback silence to the segmenter).
    """

    def __init__(self, cfg: TurnConfig, frame_ms: int = FRAME_MS, endpoint_ms: int | None = None) -> None:
        self.cfg, self.frame_ms = cfg, frame_ms
        self.endpoint_ms = cfg.endpoint_ms if endpoint_ms is None else endpoint_ms
        self.in_speech = False
        self.run_ms = 0  # consecutive voiced ms (outside a segment) or unvoiced ms (inside)
        self.speech_ms = 0
        self.segment_ms = 0

    def update(self, voiced: bool) -> SegmentEvent | None:
        """Feed one frame's decision; returns ``"start"``, ``"end"`` or ``None``."""
        f = self.frame_ms
        if not self.in_speech:
            self.run_ms = self.run_ms + f if voiced else 0
            if self.run_ms >= self.cfg.start_ms:
                self.in_speech, self.speech_ms, self.segment_ms, self.run_ms = (
                    True,
                    self.run_ms,
                    self.run_ms,
                    0,
                )
                return "start"
            return None
        self.segment_ms += f
        if voiced:
            self.speech_ms += f
            self.run_ms = 0
        else:
            self.run_ms += f
        if self.run_ms >= self.endpoint_ms or self.segment_ms >= self.cfg.max_turn_ms:
            self.in_speech, self.run_ms = False, 0
            return "end"
        return None

    def end(self) -> bool:
        """End the open segment now (the end-of-turn policy decided); ``False`` if none is open.
        ``speech_ms`` keeps the closed segment's value until the next one starts."""
        if not self.in_speech:
            return False
        self.in_speech, self.run_ms = False, 0
        return True

    @property
    def trailing_silence_ms(self) -> int:
        """Unvoiced audio at the end of the open segment (ms); 0 outside a segment."""
        return self.run_ms if self.in_speech else 0
