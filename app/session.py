"""A full-duplex conversation, independent of any transport.

The transport pushes the user's audio in 20 ms frames (:meth:`Session.push_audio`, 16 kHz mono) and
pulls the assistant's audio one frame per frame period at real-time pace (:meth:`Session.pull_audio`,
``output_rate``). In between, the session runs turn-taking:

* webrtcvad per frame → :class:`~omniduplex.app.vad.SpeechSegmenter`; ``endpoint_ms`` of trailing
  silence commits the segment as a user turn to the :class:`~omniduplex.app.responder.Responder`.
* While a reply is pending or playing, a segment reaching ``barge_in_ms`` of speech is a barge-in:
  the playout buffer is flushed at once (the next pulled frame is silence), the pipeline request is
  cancelled, and the history keeps only the played part of the reply
  (:func:`~omniduplex.app.history.truncate_reply`). Shorter speech over a reply is ignored.
* History carries across turns.

Decisions count audio frames, never wall time; the injectable ``clock`` (seconds, monotonic) only
timestamps events and measures latency, so tests drive it deterministically.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from .events import (
    BargeIn,
    ReplyAudioStarted,
    ReplyEnded,
    ReplyText,
    SessionClosed,
    SessionError,
    SessionEvent,
    SessionStarted,
    UserSpeechStarted,
    UserTurnCommitted,
)
from .history import History, truncate_reply
from .playout import PlayoutBuffer
from .responder import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta, Responder
from .vad import (
    FRAME_MS,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    FrameVad,
    SpeechSegmenter,
    TurnConfig,
    WebRtcVad,
    to_int16,
)

log = logging.getLogger("omniduplex.session")

Clock = Callable[[], float]
"""Monotonic time in seconds."""


@dataclass
class SessionConfig:
    """Per-session settings. ``output_rate``: rate of :meth:`Session.pull_audio` (Hz).

    ``user_text``: what the history records for a spoken user turn (the pipeline has no ASR);
    ``{seconds}`` is replaced by the turn's speech length.
    """

    turn: TurnConfig = field(default_factory=TurnConfig)
    output_rate: int = 48000
    vad_aggressiveness: int = 2
    history_entries: int = 16
    user_text: str = "[spoken turn, {seconds:.1f} s]"


@dataclass
class _Reply:
    """The reply in flight: counters in samples at the output rate, times on the session clock (s)."""

    turn_id: str
    t_commit: float
    t_speech_end: float
    text: list[str] = field(default_factory=list)
    generated: int = 0
    played: int = 0
    t_first_audio: float | None = None
    generation_done: bool = False
    interrupted_at: float | None = None
    task: asyncio.Task | None = None


@dataclass
class SessionStats:
    """Measurements of a session, one entry per event (ms)."""

    turns: int = 0
    barge_ins: int = 0
    latency_ms: list[float] = field(default_factory=list)
    stop_ms: list[float] = field(default_factory=list)


class Session:
    """One conversation. Call :meth:`push_audio` / :meth:`pull_audio` from the event loop thread.

    Args:
        session_id: names the session in events and pipeline request ids.
        responder: where replies come from (shared by sessions; turn ids are session-unique).
        emit: receives every :class:`~omniduplex.app.events.SessionEvent`; must not block.
        cfg: thresholds and rates.
        vad: per-frame speech decision (default: webrtcvad at ``cfg.vad_aggressiveness``).
        clock: monotonic seconds (default ``time.monotonic``).
    """

    def __init__(
        self,
        session_id: str,
        responder: Responder,
        emit: Callable[[SessionEvent], None],
        cfg: SessionConfig | None = None,
        vad: FrameVad | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.id, self.responder, self._emit, self.clock = session_id, responder, emit, clock
        self.cfg = cfg or SessionConfig()
        self.vad = vad or WebRtcVad(self.cfg.vad_aggressiveness)
        self.segmenter = SpeechSegmenter(self.cfg.turn)
        self.preroll: deque[np.ndarray] = deque(maxlen=max(1, self.cfg.turn.preroll_ms // FRAME_MS))
        self.turn_frames: list[np.ndarray] = []
        self.unvoiced_tail = 0  # consecutive unvoiced frames at the end of turn_frames
        self.playout = PlayoutBuffer(responder.output_rate, self.cfg.output_rate)
        self.history = History(self.cfg.history_entries)
        self.reply: _Reply | None = None
        self.tasks: set[asyncio.Task] = set()
        self.stats = SessionStats()
        self.closed = False
        self.t0 = clock()
        self.last_voiced_at = self.t0
        self._turn_numbers = itertools.count(1)
        self.emit(SessionStarted(self.id, config=asdict(self.cfg.turn)))

    # -- transport → session -----------------------------------------------------------------------
    def push_audio(self, frame: np.ndarray) -> None:
        """One 20 ms input frame: 320 samples, 16 kHz mono, int16 or float in [-1, 1]."""
        if self.closed:
            return
        pcm = to_int16(np.asarray(frame).reshape(-1))
        if pcm.size != FRAME_SAMPLES:
            raise ValueError(f"input frame must be {FRAME_SAMPLES} samples (20 ms at {SAMPLE_RATE} Hz)")
        now = self.clock()
        voiced = self.vad.is_speech(pcm)
        if voiced:
            self.last_voiced_at = now
        was_in_speech = self.segmenter.in_speech
        event = self.segmenter.update(voiced)
        if event == "start":
            self.turn_frames = [*self.preroll, pcm]
            self.preroll.clear()
            self.unvoiced_tail = 0
            self.emit(UserSpeechStarted(self.id, at_ms=self._ms(now)))
        elif was_in_speech:
            self.turn_frames.append(pcm)
            self.unvoiced_tail = 0 if voiced else self.unvoiced_tail + 1
        else:
            self.preroll.append(pcm)
        in_segment = was_in_speech or event == "start"
        if in_segment and self._reply_active() and self.segmenter.speech_ms >= self.cfg.turn.barge_in_ms:
            self._barge_in(now)
        if event == "end":
            self._end_segment(now)

    # -- session → transport -----------------------------------------------------------------------
    def pull_audio(self, n: int) -> np.ndarray:
        """The next ``n`` output samples (int16 mono at ``cfg.output_rate``); silence when idle.

        The transport calls this once per frame period, when the frame is due on the wire.
        """
        now = self.clock()
        out, filled = self.playout.read(n)
        r = self.reply
        if r is None:
            return out
        if r.interrupted_at is not None:  # the first frame after a barge-in: playback has stopped
            self._end_reply(r, "interrupted", stop_ms=1000.0 * (now - r.interrupted_at))
            return out
        if filled:
            r.played += filled
            if r.t_first_audio is None:
                r.t_first_audio = now
                latency = 1000.0 * (now - r.t_speech_end)
                self.stats.latency_ms.append(latency)
                self.emit(
                    ReplyAudioStarted(
                        self.id, r.turn_id, latency_ms=latency, commit_to_audio_ms=1000.0 * (now - r.t_commit)
                    )
                )
                log.info("%s: first reply audio %.0f ms after end of speech", r.turn_id, latency)
        if r.generation_done and self.playout.queued == 0:
            self.history.add("assistant", "".join(r.text))
            self._end_reply(r, "completed")
        return out

    async def close(self, reason: str = "closed") -> None:
        """Cancel the reply in flight, wait for its stream to end, emit ``session_closed``. Idempotent."""
        if self.closed:
            return
        self.closed = True
        r = self.reply
        if r is not None:
            self.responder.cancel(r.turn_id)
            self.playout.flush()
            if r.interrupted_at is not None:
                self._end_reply(r, "interrupted", stop_ms=1000.0 * (self.clock() - r.interrupted_at))
            else:
                self._end_reply(r, "closed")
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=5.0)
            for t in pending:
                t.cancel()
        self.emit(SessionClosed(self.id, reason=reason))

    # -- internals ---------------------------------------------------------------------------------
    def emit(self, ev: SessionEvent) -> None:
        try:
            self._emit(ev)
        except Exception:  # a broken client channel must not break turn-taking
            log.exception("%s: event sink failed on %s", self.id, ev.type)

    def _ms(self, t: float) -> float:
        return 1000.0 * (t - self.t0)

    def _reply_active(self) -> bool:
        return self.reply is not None and self.reply.interrupted_at is None

    def _end_segment(self, now: float) -> None:
        frames, self.turn_frames = self.turn_frames, []
        speech_ms = self.segmenter.speech_ms
        if self._reply_active() or speech_ms < self.cfg.turn.min_turn_ms:
            return  # speech over the reply that did not barge in, or noise
        keep = max(1, len(frames) - max(0, self.unvoiced_tail - 5))  # keep 100 ms of trailing silence
        self._commit(frames[:keep], speech_ms, now)

    def _commit(self, frames: list[np.ndarray], speech_ms: float, now: float) -> None:
        if self.reply is not None:  # an interrupted reply whose stop frame was never pulled
            r = self.reply
            self._end_reply(r, "interrupted", stop_ms=1000.0 * (now - r.interrupted_at))
        turn_id = f"{self.id}-{next(self._turn_numbers)}"
        wav = np.concatenate(frames).astype(np.float32) / 32768.0
        history = self.history.snapshot()
        try:
            self.responder.start(turn_id, wav, history)
        except Exception as e:
            log.exception("%s: could not start turn", turn_id)
            self.emit(SessionError(self.id, message=f"could not start turn: {e}"))
            return
        user_text = self.cfg.user_text.format(seconds=speech_ms / 1000.0)
        self.history.add("user", user_text)
        self.stats.turns += 1
        r = _Reply(turn_id, t_commit=now, t_speech_end=self.last_voiced_at)
        self.reply = r
        r.task = asyncio.get_running_loop().create_task(self._consume(r), name=f"reply-{turn_id}")
        self.tasks.add(r.task)
        r.task.add_done_callback(self.tasks.discard)
        self.emit(
            UserTurnCommitted(
                self.id,
                turn_id,
                audio_ms=1000.0 * wav.size / SAMPLE_RATE,
                speech_ms=speech_ms,
                speech_end_at_ms=self._ms(self.last_voiced_at),
                text=user_text,
            )
        )

    async def _consume(self, r: _Reply) -> None:
        """Move one reply's stream into the playout buffer; drains to the end even after a barge-in."""
        try:
            async for ev in self.responder.events(r.turn_id):
                live = self.reply is r and r.interrupted_at is None and not self.closed
                if not live:
                    continue
                if isinstance(ev, ReplyTextDelta):
                    r.text.append(ev.text)
                    self.emit(ReplyText(self.id, r.turn_id, ev.text))
                elif isinstance(ev, ReplyAudioChunk):
                    r.generated += self.playout.push(ev.pcm)
                elif isinstance(ev, ReplyDone):
                    r.generated += self.playout.push(np.zeros(0, np.float32), last=True)
                    r.generation_done = True
                elif isinstance(ev, ReplyFailed):
                    self.playout.flush()
                    self._end_reply(r, "error", error=ev.error)
        except Exception as e:
            log.exception("%s: reply stream failed", r.turn_id)
            if self.reply is r and r.interrupted_at is None:
                self.playout.flush()
                self._end_reply(r, "error", error=str(e))

    def _barge_in(self, now: float) -> None:
        r = self.reply
        r.interrupted_at = now
        self.playout.flush()
        self.responder.cancel(r.turn_id)
        played_ms = self._out_ms(r.played)
        self.history.add("assistant", truncate_reply("".join(r.text), played_ms, self._out_ms(r.generated)))
        self.stats.barge_ins += 1
        self.emit(BargeIn(self.id, r.turn_id, speech_ms=self.segmenter.speech_ms, played_ms=played_ms))

    def _end_reply(self, r: _Reply, reason: str, stop_ms: float | None = None, error: str = "") -> None:
        if self.reply is not r:
            return
        self.reply = None
        text = "".join(r.text)
        played, generated = self._out_ms(r.played), self._out_ms(r.generated)
        if reason == "completed":
            kept = text
        elif reason in ("interrupted", "closed"):
            kept = truncate_reply(text, played, generated)
        else:
            kept = ""
        if stop_ms is not None:
            self.stats.stop_ms.append(stop_ms)
            log.info("%s: barge-in, playback stopped %.1f ms after detection", r.turn_id, stop_ms)
        self.emit(
            ReplyEnded(
                self.id,
                r.turn_id,
                reason=reason,
                played_ms=played,
                generated_ms=generated,
                text=text,
                kept_text=kept,
                stop_ms=stop_ms,
                error=error,
            )
        )

    def _out_ms(self, samples: int) -> float:
        return 1000.0 * samples / self.cfg.output_rate
