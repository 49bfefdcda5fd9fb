"""A full-duplex conversation, independent of any transport.

The transport pushes the user's audio in 20 ms frames (:meth:`Session.push_audio`, 16 kHz mono) and
pulls the assistant's audio one frame per frame period at real-time pace (:meth:`Session.pull_audio`,
``output_rate``). In between, the session runs turn-taking:

* webrtcvad per frame → :class:`~omniduplex.app.vad.SpeechSegmenter`; ``endpoint_ms`` of trailing
  silence commits the segment as a user turn to the :class:`~omniduplex.app.replies.Responder`.
  With ``turn_detection="smart"`` the Smart Turn model is asked instead, after ``smart_check_ms`` of
  silence, in a worker thread (:class:`~omniduplex.app.turn_detection.EndOfTurnPolicy`): "complete"
  commits at once if no speech came meanwhile, "incomplete" waits through the pause (up to
  ``smart_max_silence_ms``).
* While a reply is pending or playing, a segment reaching ``barge_in_ms`` of speech is a barge-in:
  the playout buffer is flushed at once (the next pulled frame is silence), the pipeline request is
  cancelled, and the history keeps only the played part of the reply: by the audio stage's text↔audio
  alignment when its chunks carry their words (:func:`~omniduplex.app.history.truncate_aligned`), else
  in proportion to played audio (:func:`~omniduplex.app.history.truncate_reply`). Shorter speech over a
  reply is ignored.
* History carries across turns. A user turn is recorded as its ASR transcript when the pipeline sends
  one (a placeholder until then, or for good when the graph has no ASR); an empty transcript removes it.

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

from omniduplex.app.events import (
    BargeIn,
    ReplyAudioStarted,
    ReplyEnded,
    ReplySpoken,
    ReplyStarted,
    ReplyText,
    SessionClosed,
    SessionError,
    SessionEvent,
    SessionStarted,
    UserSpeechStarted,
    UserTranscriptEvent,
    UserTurnCommitted,
)
from omniduplex.app.history import History, truncate_aligned, truncate_reply
from omniduplex.app.playout import PlayoutBuffer
from omniduplex.app.replies import (
    ReplyAudioChunk,
    ReplyDone,
    ReplyFailed,
    ReplyTextDelta,
    Responder,
    UserTranscript,
)
from omniduplex.app.turn_detection import SMART_TURN_SAMPLES, EndOfTurnPolicy, TurnModel
from omniduplex.app.vad import (
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

    ``user_text``: what the history records for a spoken user turn until (or unless) the pipeline sends
    its transcript; ``{seconds}`` is replaced by the turn's speech length. ``instructions``: this
    session's system prompt (``None`` = the server's). ``auto_respond``: a turn committed by the VAD
    starts its reply at once (else it waits for :meth:`Session.respond`). ``vad_commit``: the VAD
    commits turns (``False``: only :meth:`Session.commit_audio` does, as with the Realtime API's
    ``turn_detection: null``; speech events and barge-in still follow the VAD).
    """

    turn: TurnConfig = field(default_factory=TurnConfig)
    output_rate: int = 48000
    vad_aggressiveness: int = 2
    history_entries: int = 16
    user_text: str = "[spoken turn, {seconds:.1f} s]"
    instructions: str | None = None
    auto_respond: bool = True
    vad_commit: bool = True


@dataclass
class _Reply:
    """The reply in flight: counters in samples at the output rate, times on the session clock (s)."""

    turn_id: str
    t_commit: float
    t_speech_end: float
    text: list[str] = field(default_factory=list)
    chunks: list[tuple[int, str]] = field(default_factory=list)  # (generated at chunk end, words spoken)
    user_entry: list[str] | None = None  # this turn's user entry in the history
    assistant_entry: list[str] | None = None  # the reply's entry, once it has one
    spoken: int = 0  # chunks whose audio has started playing (ReplySpoken emitted)
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
        turn_model: end-of-turn classifier, required when ``cfg.turn.turn_detection == "smart"``
            (:func:`~omniduplex.app.turn_detection.load_turn_model`; one instance serves all sessions).

    Raises:
        ValueError: ``turn_detection="smart"`` without a ``turn_model``.
    """

    def __init__(
        self,
        session_id: str,
        responder: Responder,
        emit: Callable[[SessionEvent], None],
        cfg: SessionConfig | None = None,
        vad: FrameVad | None = None,
        clock: Clock = time.monotonic,
        turn_model: TurnModel | None = None,
    ) -> None:
        self.id, self.responder, self._emit, self.clock = session_id, responder, emit, clock
        self.cfg = cfg or SessionConfig()
        self.vad = vad or WebRtcVad(self.cfg.vad_aggressiveness)
        self.set_turn_config(self.cfg.turn, turn_model)
        self.playout = PlayoutBuffer(responder.output_rate, self.cfg.output_rate)
        self.history = History(self.cfg.history_entries)
        self.reply: _Reply | None = None
        self.pending: tuple[str, np.ndarray, list[str] | None] | None = None  # committed, not answered
        self.done_replies: dict[str, tuple[_Reply, list[str] | None]] = {}  # for truncate(), newest last
        self.entries: dict[tuple[str, str], list[str]] = {}  # (turn id, role) → its history entry
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
        elif self.segmenter.in_speech:
            self._end_of_turn(now)

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
            self._captions(r)
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
            r.assistant_entry = self.history.add("assistant", "".join(r.text))
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
        observe = getattr(self.responder, "observe", None)  # the server's metrics and log context, first
        for sink in (observe, self._emit) if observe is not None else (self._emit,):
            try:
                sink(ev)
            except Exception:  # a broken client channel must not break turn-taking
                log.exception("%s: event sink failed on %s", self.id, ev.type)

    def _ms(self, t: float) -> float:
        return 1000.0 * (t - self.t0)

    def _reply_active(self) -> bool:
        return self.reply is not None and self.reply.interrupted_at is None

    def _end_of_turn(self, now: float) -> None:
        """Apply the end-of-turn policy to the open segment after a frame: ask the model, or end it."""
        silence_ms = self.segmenter.trailing_silence_ms
        if silence_ms == 0:  # speech: a check of the previous pause is stale, the next pause is a new one
            self._turn_check = self._turn_verdict = None
            return
        action = self.turn_policy.decide(
            silence_ms,
            self.segmenter.speech_ms,
            checked=self._turn_check is not None,
            probability=self._turn_verdict,
            replying=self._reply_active(),
        )
        if action == "check":
            self._start_turn_check()
        elif action == "end":
            self.segmenter.end()
            self._end_segment(now)

    def _start_turn_check(self) -> None:
        """Run the turn model on the segment so far (its last 8 s) in a worker thread."""
        frames = self.turn_frames[-(SMART_TURN_SAMPLES // FRAME_SAMPLES) :]
        audio = np.concatenate(frames).astype(np.float32) / 32768.0  # a copy: the worker owns it
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run_turn_check(audio), name=f"turn-check-{self.id}")
        self._turn_check = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_turn_check(self, audio: np.ndarray) -> float | None:
        """The model's verdict on ``audio`` (16 kHz float32), applied when it returns if the segment is
        still in the same pause; returns the probability (``None`` if the model failed: the segment then
        waits for the fallback silence)."""
        silence_ms, t = self.segmenter.trailing_silence_ms, time.perf_counter()
        try:
            p = await asyncio.to_thread(self.turn_model.probability, audio)
        except Exception:
            log.exception("%s: end-of-turn model failed; the turn ends after %d ms of silence",
                          self.id, self.turn_policy.silence_limit_ms)
            return None
        log.debug("%s: end of turn p=%.3f after %d ms of silence (model %.0f ms)",
                  self.id, p, silence_ms, 1000.0 * (time.perf_counter() - t))
        if asyncio.current_task() is not self._turn_check or self.closed:
            return p  # speech resumed or the segment ended while the model ran: the verdict is stale
        self._turn_verdict = p
        self._end_of_turn(self.clock())
        return p

    async def settle(self) -> None:
        """Wait until the end-of-turn check in flight, if any, has returned and its verdict is applied.
        Tests call it after each frame to make smart endpointing deterministic in audio frames."""
        task = self._turn_check
        if task is not None and not task.done():
            await asyncio.wait({task})

    def _end_segment(self, now: float) -> None:
        self._turn_check = self._turn_verdict = None
        frames, self.turn_frames = self.turn_frames, []
        speech_ms = self.segmenter.speech_ms
        if self._reply_active() or speech_ms < self.cfg.turn.min_turn_ms:
            return  # speech over the reply that did not barge in, or noise
        if not self.cfg.vad_commit:
            return
        keep = max(1, len(frames) - max(0, self.unvoiced_tail - 5))  # keep 100 ms of trailing silence
        self._commit(frames[:keep], speech_ms, now, respond=self.cfg.auto_respond)

    def _commit(self, frames: list[np.ndarray], speech_ms: float, now: float, respond: bool = True) -> str:
        """Close a spoken user turn: record it (a placeholder until its transcript comes) and, with
        ``respond``, start the reply to it at once; otherwise it waits for :meth:`respond`. Returns the
        turn id."""
        self._end_stopped_reply(now)
        turn_id = f"{self.id}-{next(self._turn_numbers)}"
        wav = np.concatenate(frames).astype(np.float32) / 32768.0 if frames else np.zeros(0, np.float32)
        user_text = self.cfg.user_text.format(seconds=speech_ms / 1000.0)
        entry = self.history.add("user", user_text)
        self.entries[(turn_id, "user")] = entry
        self.pending = (turn_id, wav, entry)
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
        if respond:
            self.respond()
        return turn_id

    def _end_stopped_reply(self, now: float) -> None:
        if self.reply is not None and self.reply.interrupted_at is not None:  # its stop frame never pulled
            r = self.reply
            self._end_reply(r, "interrupted", stop_ms=1000.0 * (now - r.interrupted_at))

    def set_turn_config(self, turn: TurnConfig, turn_model: TurnModel | None = None) -> None:
        """Use ``turn`` for turn-taking from now on (Realtime ``session.update``); an open speech segment is
        dropped.

        Raises:
            ValueError: ``turn_detection="smart"`` without a ``turn_model``.
        """
        policy = EndOfTurnPolicy.from_config(turn)
        if policy.mode == "smart" and turn_model is None:
            raise ValueError("turn_detection='smart' needs a turn model (app.turn_detection.load_turn_model)")
        self.cfg.turn, self.turn_policy, self.turn_model = turn, policy, turn_model
        self._turn_check: asyncio.Task | None = None  # the model's check of the current pause
        self._turn_verdict: float | None = None  # its probability, once in
        self.segmenter = SpeechSegmenter(turn, endpoint_ms=policy.silence_limit_ms)
        self.preroll: deque[np.ndarray] = deque(maxlen=max(1, turn.preroll_ms // FRAME_MS))
        self.turn_frames: list[np.ndarray] = []
        self.unvoiced_tail = 0  # consecutive unvoiced frames at the end of turn_frames

    # -- typed input, explicit responses, truncation (Realtime API, LiveKit) ----------------------
    def commit_audio(self, wav: np.ndarray, respond: bool = True) -> str:
        """Commit ``wav`` (16 kHz mono float32 in [-1, 1]) as a spoken user turn, whatever the VAD says
        (Realtime ``input_audio_buffer.commit``, or an ``input_audio`` item); returns its turn id.

        Raises:
            ValueError: ``wav`` is not 1-D.
        """
        wav = np.asarray(wav, np.float32)
        if wav.ndim != 1:
            raise ValueError(f"user audio must be 1-D 16 kHz samples, got shape {wav.shape}")
        pcm = to_int16(wav)
        frames = [pcm[i : i + FRAME_SAMPLES] for i in range(0, pcm.size, FRAME_SAMPLES)]
        return self._commit(frames, 1000.0 * wav.size / SAMPLE_RATE, self.clock(), respond=respond)

    def forget(self, turn_id: str, role: str) -> bool:
        """Drop the ``role`` (``user``/``assistant``) entry of turn ``turn_id`` from the history (Realtime
        ``conversation.item.delete``); ``False`` when there is none."""
        entry = self.entries.pop((turn_id, role), None)
        if entry is None or not any(e is entry for e in self.history.entries):
            return False
        self.history.remove(entry)
        return True

    def add_user_text(self, text: str) -> list[str] | None:
        """Record a typed user message (Realtime ``conversation.item.create``); :meth:`respond` answers it.
        Returns its history entry (``None`` for empty text)."""
        return self.history.add("user", text.strip())

    def respond(self, instructions: str | None = None, metadata: dict | None = None) -> str | None:
        """Start a reply now; returns its turn id, or ``None`` when it could not start.

        The reply answers the committed spoken turn that has no reply yet, if any; otherwise the
        conversation as it stands (a trailing typed user message is the turn's text). ``instructions``
        add to the system prompt for this reply only (Realtime ``response.create``, LiveKit
        ``generate_reply``); ``metadata`` travels with the turn. A reply in flight is cancelled first.
        """
        now = self.clock()
        if self._reply_active():
            self.cancel_reply()
        self._end_stopped_reply(now)
        options: dict = {"metadata": dict(metadata or {})}
        if self.cfg.instructions:
            options["system_prompt"] = self.cfg.instructions
        if instructions:
            options["instructions"] = instructions
        if self.pending is not None:
            turn_id, wav, entry = self.pending
            self.pending = None
            history = [list(e) for e in self.history.entries if e is not entry]
        else:
            turn_id, wav = f"{self.id}-{next(self._turn_numbers)}", np.zeros(0, np.float32)
            history = self.history.snapshot()
            entry = self.history.entries[-1] if history and history[-1][0] == "user" else None
            options["user_text"] = entry[1] if entry else ""
            if entry is not None:
                history = history[:-1]
        try:
            self.responder.start(turn_id, wav, history, options)
        except Exception as e:
            log.exception("%s: could not start turn", turn_id)
            self.emit(SessionError(self.id, message=f"could not start turn: {e}"))
            return None
        self.stats.turns += 1
        r = _Reply(turn_id, t_commit=now, t_speech_end=self.last_voiced_at if wav.size else now)
        r.user_entry = entry
        self.reply = r
        self.emit(ReplyStarted(self.id, turn_id, metadata=dict(metadata or {})))
        r.task = asyncio.get_running_loop().create_task(self._consume(r), name=f"reply-{turn_id}")
        self.tasks.add(r.task)
        r.task.add_done_callback(self.tasks.discard)
        return turn_id

    def cancel_reply(self) -> bool:
        """Stop the reply in flight as a barge-in would (playout flushed, pipeline turn cancelled, history
        keeps the played part); ``False`` when nothing is playing or pending."""
        if not self._reply_active():
            return False
        self._barge_in(self.clock(), speech_ms=0.0)
        return True

    def truncate(self, turn_id: str, audio_end_ms: float) -> str | None:
        """The client played only ``audio_end_ms`` ms of reply ``turn_id`` (Realtime
        ``conversation.item.truncate``, LiveKit ``truncate``): its history entry keeps the words of that
        audio (text↔audio alignment when known). Returns the kept text, or ``None`` for an unknown turn.

        Raises:
            ValueError: ``audio_end_ms`` is negative or past the end of the reply's audio.
        """
        rec = self.done_replies.get(turn_id)
        if rec is None:
            return None
        r, entry = rec
        if audio_end_ms < 0 or self._samples(audio_end_ms) > r.generated + 1:
            end = self._out_ms(r.generated)
            raise ValueError(f"audio_end_ms {audio_end_ms:.0f} is past the reply's audio (0 … {end:.0f} ms)")
        r.played = min(r.played, self._samples(audio_end_ms))
        kept = self._kept_text(r)
        if entry is not None and kept:
            entry[1] = kept
        elif entry is not None:
            self.history.remove(entry)
            self.done_replies[turn_id] = (r, None)
        elif kept:
            self.done_replies[turn_id] = (r, self.history.add("assistant", kept))
        return kept

    def _samples(self, ms: float) -> int:
        return round(ms * self.cfg.output_rate / 1000.0)

    async def _consume(self, r: _Reply) -> None:
        """Move one reply's stream into the playout buffer; drains to the end even after a barge-in."""
        try:
            async for ev in self.responder.events(r.turn_id):
                if isinstance(ev, UserTranscript):  # what the user said stands even if the reply is cut
                    self._user_transcript(r, ev)
                    continue
                live = self.reply is r and r.interrupted_at is None and not self.closed
                if not live:
                    continue
                if isinstance(ev, ReplyTextDelta):
                    r.text.append(ev.text)
                    self.emit(ReplyText(self.id, r.turn_id, ev.text))
                elif isinstance(ev, ReplyAudioChunk):
                    r.generated += self.playout.push(ev.pcm)
                    if ev.text:
                        r.chunks.append((r.generated, ev.text))
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

    def _user_transcript(self, r: _Reply, ev: UserTranscript) -> None:
        text = ev.text.strip()
        if text and r.user_entry is not None:
            r.user_entry[1] = text
        elif text:
            r.user_entry = self.entries[(r.turn_id, "user")] = self.history.add("user", text)
        else:
            self.history.remove(r.user_entry)
            r.user_entry = None
        self.emit(UserTranscriptEvent(self.id, r.turn_id, text=text, words=list(ev.words)))

    def _kept_text(self, r: _Reply) -> str:
        """What the user heard of an interrupted reply (see the module docstring)."""
        if r.chunks:
            return truncate_aligned(r.chunks, r.played)
        return truncate_reply("".join(r.text), self._out_ms(r.played), self._out_ms(r.generated))

    def _captions(self, r: _Reply) -> None:
        """Emit :class:`ReplySpoken` for each aligned chunk whose audio has started playing (captions
        in step with the audio, not with generation)."""
        while r.spoken < len(r.chunks):
            start = r.chunks[r.spoken - 1][0] if r.spoken else 0
            if r.played <= start:
                return
            self.emit(ReplySpoken(self.id, r.turn_id, text=r.chunks[r.spoken][1], at_ms=self._out_ms(start)))
            r.spoken += 1

    def _barge_in(self, now: float, speech_ms: float | None = None) -> None:
        r = self.reply
        r.interrupted_at = now
        self.playout.flush()
        self.responder.cancel(r.turn_id)
        played_ms = self._out_ms(r.played)
        r.assistant_entry = self.history.add("assistant", self._kept_text(r))
        self.stats.barge_ins += 1
        speech = self.segmenter.speech_ms if speech_ms is None else speech_ms
        self.emit(BargeIn(self.id, r.turn_id, speech_ms=speech, played_ms=played_ms))

    def _end_reply(self, r: _Reply, reason: str, stop_ms: float | None = None, error: str = "") -> None:
        if self.reply is not r:
            return
        self.reply = None
        self.done_replies[r.turn_id] = (r, r.assistant_entry)
        if r.assistant_entry is not None:
            self.entries[(r.turn_id, "assistant")] = r.assistant_entry
        while len(self.done_replies) > self.cfg.history_entries:
            self.done_replies.pop(next(iter(self.done_replies)))
        text = "".join(r.text)
        played, generated = self._out_ms(r.played), self._out_ms(r.generated)
        if reason == "completed":
            kept = text
        elif reason in ("interrupted", "closed"):
            kept = self._kept_text(r)
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
