"""Turn-taking: when the user speaks, when their turn ends, when their speech over a reply is a barge-in.

:class:`TurnTaker` takes the user's audio in 20 ms frames (16 kHz mono int16) and decides, frame by frame:

* webrtcvad per frame → :class:`~omniduplex.app.core.vad.SpeechSegmenter`; a segment opens after
  ``start_ms`` of speech (``on_speech_started``), keeping ``preroll_ms`` of audio from before it;
* end of turn: ``endpoint_ms`` of trailing silence ends the segment, or, with ``turn_detection="smart"``,
  the Smart Turn model is asked after ``smart_check_ms`` of silence, in a worker thread
  (:class:`~omniduplex.app.core.turn_detection.EndOfTurnPolicy`): "complete" ends it at once if no speech came
  meanwhile, "incomplete" waits through the pause (up to ``smart_max_silence_ms``). A segment of at least
  ``min_turn_ms`` of speech, ended while no reply is playing, is a user turn (``on_turn``, with its audio
  and 100 ms of trailing silence);
* barge-in: while a reply plays (``replying()``), a segment reaching ``barge_in_ms`` of speech calls
  ``on_barge_in``; shorter speech over a reply is ignored, and never becomes a turn.

Decisions count audio frames, never wall time; ``clock`` (monotonic seconds) only timestamps them. What a
turn, a reply or a barge-in does to the conversation is :mod:`~omniduplex.app.core.conversation`'s business.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from omniduplex.app.core.audio.pcm import FRAME_MS, FRAME_SAMPLES
from omniduplex.app.core.turn_detection import SMART_TURN_SAMPLES, EndOfTurnPolicy, TurnModel
from omniduplex.app.core.vad import FrameVad, SpeechSegmenter, TurnConfig

log = logging.getLogger("omniduplex.session")

TRAILING_SILENCE_FRAMES = 5
"""Unvoiced frames (100 ms) kept at the end of a turn's audio: the ASR hears the last word's decay."""


class TurnTaker:
    """Turn-taking over one user's audio. Call from the event loop thread.

    Args:
        name: names the session in logs and task names.
        turn: thresholds (ms) and the end-of-turn mode.
        vad: per-frame speech decision.
        clock: monotonic seconds.
        turn_model: end-of-turn classifier, required when ``turn.turn_detection == "smart"``.
        replying: whether a reply is playing now (speech over it may barge in and is not a turn).
        on_speech_started: ``(now)``, a speech segment opened.
        on_barge_in: ``(now, speech_ms)``, speech over the reply reached ``barge_in_ms``.
        on_turn: ``(frames, speech_ms, now)``, a segment ended as a user turn: its 20 ms int16 frames.

    Raises:
        ValueError: ``turn_detection="smart"`` without a ``turn_model``.
    """

    def __init__(
        self,
        name: str,
        turn: TurnConfig,
        vad: FrameVad,
        clock: Callable[[], float],
        turn_model: TurnModel | None,
        replying: Callable[[], bool],
        on_speech_started: Callable[[float], None],
        on_barge_in: Callable[[float, float], None],
        on_turn: Callable[[list[np.ndarray], float, float], None],
    ) -> None:
        self.name, self.vad, self.clock, self.replying = name, vad, clock, replying
        self.on_speech_started, self.on_barge_in, self.on_turn = on_speech_started, on_barge_in, on_turn
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        self.last_voiced_at = clock()
        """Clock time of the last voiced frame (s): the end of the user's speech."""
        self.configure(turn, turn_model)

    def configure(self, turn: TurnConfig, turn_model: TurnModel | None = None) -> None:
        """Use ``turn`` from now on; an open speech segment is dropped.

        Raises:
            ValueError: ``turn_detection="smart"`` without a ``turn_model``.
        """
        policy = EndOfTurnPolicy.from_config(turn)
        if policy.mode == "smart" and turn_model is None:
            raise ValueError(
                "turn_detection='smart' needs a turn model (app.core.turn_detection.load_turn_model)"
            )
        self.turn, self.policy, self.turn_model = turn, policy, turn_model
        self._check: asyncio.Task[Any] | None = None  # the model's check of the current pause
        self._verdict: float | None = None  # its probability, once in
        self.segmenter = SpeechSegmenter(turn, endpoint_ms=policy.silence_limit_ms)
        self.preroll: deque[np.ndarray] = deque(maxlen=max(1, turn.preroll_ms // FRAME_MS))
        self.frames: list[np.ndarray] = []  # the open segment's audio
        self.unvoiced_tail = 0  # consecutive unvoiced frames at the end of self.frames

    def drop_speech(self) -> bool:
        """Forget the open speech segment (its audio does not become a turn); ``False`` when none is open."""
        if not self.segmenter.in_speech:
            return False
        self.configure(self.turn, self.turn_model)
        return True

    @property
    def in_speech(self) -> bool:
        """Whether a speech segment is open."""
        return self.segmenter.in_speech

    def push(self, pcm: np.ndarray) -> None:
        """One 20 ms frame: 320 int16 samples at 16 kHz."""
        now = self.clock()
        voiced = self.vad.is_speech(pcm)
        if voiced:
            self.last_voiced_at = now
        was_in_speech = self.segmenter.in_speech
        event = self.segmenter.update(voiced)
        if event == "start":
            self.frames = [*self.preroll, pcm]
            self.preroll.clear()
            self.unvoiced_tail = 0
            self.on_speech_started(now)
        elif was_in_speech:
            self.frames.append(pcm)
            self.unvoiced_tail = 0 if voiced else self.unvoiced_tail + 1
        else:
            self.preroll.append(pcm)
        in_segment = was_in_speech or event == "start"
        if in_segment and self.replying() and self.segmenter.speech_ms >= self.turn.barge_in_ms:
            self.on_barge_in(now, self.segmenter.speech_ms)
        if event == "end":
            self._end_segment(now)
        elif self.segmenter.in_speech:
            self._end_of_turn(now)

    async def settle(self) -> None:
        """Wait until the end-of-turn check in flight, if any, has returned and its verdict is applied.
        Tests call it after each frame to make smart endpointing deterministic in audio frames."""
        task = self._check
        if task is not None and not task.done():
            await asyncio.wait({task})

    def _end_of_turn(self, now: float) -> None:
        """Apply the end-of-turn policy to the open segment after a frame: ask the model, or end it."""
        silence_ms = self.segmenter.trailing_silence_ms
        if silence_ms == 0:  # speech: a check of the previous pause is stale, the next pause is a new one
            self._check = self._verdict = None
            return
        action = self.policy.decide(
            silence_ms,
            self.segmenter.speech_ms,
            checked=self._check is not None,
            probability=self._verdict,
            replying=self.replying(),
        )
        if action == "check":
            self._start_check()
        elif action == "end":
            self.segmenter.end()
            self._end_segment(now)

    def _start_check(self) -> None:
        """Run the turn model on the segment so far (its last 8 s) in a worker thread."""
        frames = self.frames[-(SMART_TURN_SAMPLES // FRAME_SAMPLES) :]
        audio = np.concatenate(frames).astype(np.float32) / 32768.0  # a copy: the worker owns it
        task = asyncio.get_running_loop().create_task(self._run_check(audio), name=f"turn-check-{self.name}")
        self._check = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_check(self, audio: np.ndarray) -> float | None:
        """The model's verdict on ``audio`` (16 kHz float32), applied when it returns if the segment is
        still in the same pause; returns the probability (``None`` if the model failed: the segment then
        waits for the fallback silence)."""
        silence_ms, t = self.segmenter.trailing_silence_ms, time.perf_counter()
        model = self.turn_model
        if model is None:
            return None
        try:
            p: float = await asyncio.to_thread(model.probability, audio)
        except Exception:
            log.exception("%s: end-of-turn model failed; the turn ends after %d ms of silence",
                          self.name, self.policy.silence_limit_ms)
            return None
        log.debug("%s: end of turn p=%.3f after %d ms of silence (model %.0f ms)",
                  self.name, p, silence_ms, 1000.0 * (time.perf_counter() - t))
        if asyncio.current_task() is not self._check or self.closed:
            return p  # speech resumed or the segment ended while the model ran: the verdict is stale
        self._verdict = p
        self._end_of_turn(self.clock())
        return p

    def turn_so_far(self) -> list[np.ndarray] | None:
        """The frames the open segment would give as a user turn if it ended now (its trailing silence cut
        to :data:`TRAILING_SILENCE_FRAMES`), or ``None`` when it would not be a turn (none open, speech over
        a reply, or shorter than ``min_turn_ms``)."""
        if not self.segmenter.in_speech:
            return None
        return self._turn_frames(self.frames)

    def _turn_frames(self, frames: list[np.ndarray]) -> list[np.ndarray] | None:
        if self.replying() or self.segmenter.speech_ms < self.turn.min_turn_ms:
            return None  # speech over the reply that did not barge in, or noise
        keep = max(1, len(frames) - max(0, self.unvoiced_tail - TRAILING_SILENCE_FRAMES))
        return frames[:keep]

    def _end_segment(self, now: float) -> None:
        self._check = self._verdict = None
        frames, self.frames = self.frames, []
        turn = self._turn_frames(frames)
        if turn is not None:
            self.on_turn(turn, self.segmenter.speech_ms, now)
