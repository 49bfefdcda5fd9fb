"""A full-duplex conversation, independent of any transport.

The transport pushes the user's audio in 20 ms frames (:meth:`Session.push_audio`, 16 kHz mono) and
pulls the assistant's audio one frame per frame period at real-time pace (:meth:`Session.pull_audio`,
``output_rate``). A :class:`Session` is two parts with one job each:

* :class:`~omniduplex.app.core.turns.TurnTaker`: VAD, end of turn (silence or Smart Turn), preroll, barge-in
  detection;
* :class:`~omniduplex.app.core.conversation.Conversation`: the reply lifecycle, the history (immutable
  entries), and truncation of a stopped reply to what was played (a prefix of its generated text);
* :class:`~omniduplex.app.core.live_asr.LiveTranscriber`: the open turn fed to the ASR while it is spoken
(when
  the responder can, and turns are committed and answered at once), partial transcripts as live captions.

This class wires them together and is the one surface transports use: they read its public properties
(``in_speech``, ``replying``, ``reply_turn_id``, ``queued_samples``...) and call its methods, never its
parts. Events emitted while a frame is pulled reach the transport after that frame (:meth:`pull_audio`).

Decisions count audio frames, never wall time; the injectable ``clock`` (seconds, monotonic) only
timestamps events and measures latency, so tests drive it deterministically.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from omniduplex.app.core.audio.pcm import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, to_float32, to_int16
from omniduplex.app.core.conversation import Conversation
from omniduplex.app.core.events import SessionClosed, SessionEvent, SessionStarted, UserSpeechStarted
from omniduplex.app.core.history import FUNCTION_CALL, Entry, History
from omniduplex.app.core.live_asr import PAUSE_FRAMES, LiveTranscriber
from omniduplex.app.core.replies import Responder
from omniduplex.app.core.reply import ReplyRecord
from omniduplex.app.core.session_config import OPTIONS, SessionConfig, SessionStats
from omniduplex.app.core.tools import ToolRunner
from omniduplex.app.core.turn_detection import TurnModel
from omniduplex.app.core.turns import TurnTaker
from omniduplex.app.core.vad import FrameVad, TurnConfig, WebRtcVad

log = logging.getLogger("omniduplex.session")

Clock = Callable[[], float]
"""Monotonic time in seconds."""


class Session:
    """One conversation. Call every method from the event loop thread.

    Args:
        session_id: names the session in events and pipeline request ids.
        responder: where replies come from (shared by sessions; turn ids are session-unique).
        emit: receives every :class:`~omniduplex.app.core.events.SessionEvent`; must not block.
        cfg: thresholds and rates.
        vad: per-frame speech decision (default: webrtcvad at ``cfg.vad_aggressiveness``).
        clock: monotonic seconds (default ``time.monotonic``).
        turn_model: end-of-turn classifier, required when ``cfg.turn.turn_detection == "smart"``
            (:func:`~omniduplex.app.core.turn_detection.load_turn_model`; one instance serves all sessions).
        tool_runner: runs the replies' function calls on the server and continues the reply with their
            results (``None``: calls are surfaced to the client, which adds the outputs:
            :mod:`~omniduplex.app.core.tools`).

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
        tool_runner: ToolRunner | None = None,
    ) -> None:
        self.id, self.responder, self._emit, self.clock = session_id, responder, emit, clock
        self.cfg = cfg or SessionConfig()
        self.stats = SessionStats()
        self.closed = False
        self._held: list[SessionEvent] | None = None  # events emitted during a pull, delivered after it
        self._conv = Conversation(session_id, responder, self.emit, self.cfg, self.stats, clock, tool_runner)
        self.t0 = self._conv.t0  # event times (``at_ms``) count from here
        self._turns = TurnTaker(
            session_id,
            self.cfg.turn,
            vad or WebRtcVad(self.cfg.vad_aggressiveness),
            clock,
            turn_model,
            replying=lambda: self._conv.replying,
            on_speech_started=self._speech_started,
            on_barge_in=self._conv.barge_in,
            on_turn=self._turn_ended,
        )
        self._live = LiveTranscriber(
            session_id, responder, self.emit, self._conv.new_turn_id, context=self._conv.prefill_context
        )
        self.emit(SessionStarted(self.id, config=asdict(self.cfg.turn)))

    # -- what surfaces read --------------------------------------------------------------------------
    @property
    def history(self) -> History:
        """The conversation so far (read it; edit it through the methods below or ``replace_all``)."""
        return self._conv.history

    @property
    def in_speech(self) -> bool:
        """The user is speaking: a speech segment is open."""
        return self._turns.in_speech

    @property
    def replying(self) -> bool:
        """A reply is pending or playing and has not been interrupted."""
        return self._conv.replying

    @property
    def reply_turn_id(self) -> str | None:
        """The turn id of the reply in flight (pending, playing, or stopping until its next pull)."""
        r = self._conv.reply
        return r.turn_id if r is not None else None

    @property
    def busy(self) -> bool:
        """A reply is in flight or a committed turn waits for one (drain waits for these)."""
        return self._conv.reply is not None or self._conv.pending is not None

    @property
    def queued_samples(self) -> int:
        """Reply audio waiting to be pulled (samples at ``cfg.output_rate``)."""
        return self._conv.playout.queued

    @property
    def turn_model(self) -> TurnModel | None:
        """The end-of-turn classifier in use (``None`` with silence endpointing)."""
        return self._turns.turn_model

    @property
    def tasks(self) -> set[asyncio.Task[Any]]:
        """Background tasks still running: reply streams and end-of-turn checks (none after :meth:`close`)."""
        return self._conv.tasks | self._turns.tasks

    def entry(self, turn_id: str, role: str) -> Entry | None:
        """The history entry of turn ``turn_id``'s ``role`` (``user`` / ``assistant``), if held."""
        return self._conv.entry(turn_id, role)

    def reply_record(self, turn_id: str) -> ReplyRecord | None:
        """What reply ``turn_id`` became so far: generated text, kept text, played and generated ms."""
        return self._conv.record(turn_id)

    # -- transport → session -----------------------------------------------------------------------
    def push_audio(self, frame: np.ndarray) -> None:
        """One 20 ms input frame: 320 samples, 16 kHz mono, int16 or float in [-1, 1].

        Raises:
            ValueError: the frame is not 320 samples.
        """
        if self.closed:
            return
        pcm = to_int16(np.asarray(frame).reshape(-1))
        if pcm.size != FRAME_SAMPLES:
            raise ValueError(f"input frame must be {FRAME_SAMPLES} samples (20 ms at {SAMPLE_RATE} Hz)")
        self._turns.push(pcm)
        if self.closed:
            return
        wanted = self.cfg.vad_commit and self.cfg.auto_respond
        self._preempt(wanted)
        pause = self._turns.unvoiced_tail == PAUSE_FRAMES
        held = self._conv.speculation is not None  # the turn so far went with it: nothing new to feed
        self._live.update(self._turns.frames, self._turns.in_speech, wanted and not held, pause)

    # -- session → transport -----------------------------------------------------------------------
    def pull_audio(
        self, n: int, deliver: Callable[[np.ndarray, int], None] | None = None
    ) -> tuple[np.ndarray, int]:
        """The next ``n`` output samples (int16 mono at ``cfg.output_rate``; silence when idle) and how many
        of them are reply audio (the rest is zero padding).

        The transport calls this once per frame period, when the frame is due on the wire. Events the pull
        causes (the reply's captions, its end) are held back and emitted after it returns, or, with
        ``deliver``, after ``deliver(pcm, filled)`` has sent the frame: a client then sees a reply's last
        audio before its end.
        """
        outer = self._held is None
        if outer:
            self._held = []
        try:
            pcm, filled = self._conv.pull(n)
            if deliver is not None:
                deliver(pcm, filled)
        finally:
            if outer:
                held, self._held = self._held, None
                for e in held or ():
                    self.emit(e)
        return pcm, filled

    async def close(self, reason: str = "closed") -> None:
        """Cancel the reply in flight, wait for its stream to end, emit ``session_closed``. Idempotent."""
        if self.closed:
            return
        self.closed = self._turns.closed = True
        self._live.drop()
        await self._conv.close()
        if self._turns.tasks:
            _, pending = await asyncio.wait(self._turns.tasks, timeout=5.0)
            for t in pending:
                t.cancel()
        self.emit(SessionClosed(self.id, reason=reason))

    async def settle(self) -> None:
        """Wait until the end-of-turn check in flight, if any, has returned and its verdict is applied.
        Tests call it after each frame to make smart endpointing deterministic in audio frames."""
        await self._turns.settle()

    # -- settings ----------------------------------------------------------------------------------
    def set_options(self, **options: Any) -> None:
        """Change this session's reply options from now on (the :class:`SessionConfig` fields
        :data:`OPTIONS`: ``instructions``, ``voice``, ``auto_respond``, ``vad_commit``, ``tools``,
        ``tool_choice``); the Realtime
        ``session.update`` and LiveKit's ``update_instructions`` come here.

        Raises:
            TypeError: an option that is not one of :data:`OPTIONS`.
        """
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"not a session option: {', '.join(unknown)} (options: {', '.join(OPTIONS)})")
        for name, value in options.items():
            setattr(self.cfg, name, value)

    def set_turn_config(self, turn: TurnConfig, turn_model: TurnModel | None = None) -> None:
        """Use ``turn`` for turn-taking from now on (Realtime ``session.update``); an open speech segment is
        dropped.

        Raises:
            ValueError: ``turn_detection="smart"`` without a ``turn_model``.
        """
        self._turns.configure(turn, turn_model)
        self._live.drop()
        self._conv.drop_speculation()
        self.cfg.turn = turn

    def drop_speech(self) -> bool:
        """Forget the open speech segment (it will not become a turn); ``False`` when none is open."""
        self._live.drop()
        self._conv.drop_speculation()
        return self._turns.drop_speech()

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
        wav = to_int16(wav).astype(np.float32) / 32768.0
        speech_ms = 1000.0 * wav.size / SAMPLE_RATE
        return self._conv.commit(wav, speech_ms, self._turns.last_voiced_at, respond=respond)

    def add_user_text(self, text: str) -> Entry | None:
        """Record a typed user message (Realtime ``conversation.item.create``); :meth:`respond` answers it.
        Returns its history entry (``None`` for empty text)."""
        return self.add_message("user", text)

    def add_message(self, role: str, text: str) -> Entry | None:
        """Record a typed ``role`` (``user`` / ``assistant``) message, stripped; ``None`` for empty text."""
        return self.history.add(role, text.strip())

    def add_function_call(self, call_id: str, name: str, arguments: str) -> Entry:
        """Record a ``function_call`` made outside a reply (a client's ``conversation.item.create``)."""
        return self.history.add_tool(FUNCTION_CALL, arguments, call_id, name)

    def add_function_output(self, call_id: str, output: str) -> Entry:
        """Record the output of call ``call_id`` (a ``function_call_output``: JSON or plain text, kept as
        given); :meth:`respond` then answers with it.

        Raises:
            KeyError: no ``function_call`` with that ``call_id`` is in the history.
        """
        return self._conv.calls.add_output(call_id, output)

    def remove_entry(self, entry: Entry | None) -> bool:
        """Drop an entry from the history (by its key); ``False`` when it is not held."""
        return self.history.remove(entry)

    def forget(self, turn_id: str, role: str) -> bool:
        """Drop the ``role`` (``user``/``assistant``) entry of turn ``turn_id`` from the history (Realtime
        ``conversation.item.delete``); ``False`` when there is none."""
        return self._conv.forget(turn_id, role)

    def respond(
        self,
        instructions: str | None = None,
        metadata: dict[str, Any] | None = None,
        tools: dict[str, Any] | None = None,
    ) -> str | None:
        """Start a reply now; returns its turn id, or ``None`` when it could not start.

        The reply answers the committed spoken turn that has no reply yet, if any; otherwise the
        conversation as it stands (a trailing typed user message is the turn's text). ``instructions``
        add to the system prompt for this reply only (Realtime ``response.create``, LiveKit
        ``generate_reply``); ``metadata`` travels with the turn; ``tools``: this reply's own ``{"tools",
        "tool_choice"}`` in place of the session's (:mod:`~omniduplex.app.core.tools`). A reply in flight
        is cancelled first.
        """
        return self._conv.respond(instructions, metadata, speech_end=self._turns.last_voiced_at, tools=tools)

    def cancel_reply(self) -> bool:
        """Stop the reply in flight as a barge-in would (playout flushed, pipeline turn cancelled, history
        keeps the played part); ``False`` when nothing is playing or pending."""
        return self._conv.cancel()

    def truncate(self, turn_id: str, audio_end_ms: float) -> str | None:
        """The client played only ``audio_end_ms`` ms of reply ``turn_id`` (Realtime
        ``conversation.item.truncate``, LiveKit ``truncate``, Twilio marks): its history entry keeps the
        words of that audio, a prefix of the generated text. Works in any order relative to the reply's
        end: a reply still playing is stopped first, one stopping or ended is truncated as it stands.
        Returns the kept text ("" = the entry is removed), or ``None`` for an unknown turn.

        Raises:
            ValueError: ``audio_end_ms`` is negative or past the end of the reply's audio.
        """
        return self._conv.truncate(turn_id, audio_end_ms)

    # -- internals ---------------------------------------------------------------------------------
    def emit(self, ev: SessionEvent) -> None:
        """Send ``ev`` to the server's observer and the transport (held back during a pull)."""
        if self._held is not None:
            self._held.append(ev)
            return
        observe = getattr(self.responder, "observe", None)  # the server's metrics and log context, first
        for sink in (observe, self._emit) if observe is not None else (self._emit,):
            try:
                sink(ev)
            except Exception:  # a broken client channel must not break turn-taking
                log.exception("%s: event sink failed on %s", self.id, ev.type)

    def _speech_started(self, now: float) -> None:
        self.emit(UserSpeechStarted(self.id, at_ms=1000.0 * (now - self._conv.t0)))

    def _preempt(self, wanted: bool) -> None:
        """Preemptive generation (``cfg.turn.preemptive_ms``): when the open segment's pause reaches it,
        start the reply to the turn so far (held until the turn ends); when speech resumes, or the segment
        ends without becoming a turn, cancel it."""
        turns, frames_ms = self._turns, self.cfg.turn.preemptive_ms // FRAME_MS
        if self._conv.speculation is not None:
            if not turns.in_speech or turns.unvoiced_tail == 0:
                self._conv.drop_speculation()
            return
        if not (wanted and frames_ms and turns.in_speech and turns.unvoiced_tail == frames_ms):
            return
        frames = turns.turn_so_far()
        if frames is not None:
            turn_id = self._live.take() or self._conv.new_turn_id()
            self._conv.speculate(turn_id, to_float32(np.concatenate(frames)))

    def _turn_ended(self, frames: list[np.ndarray], speech_ms: float, now: float) -> None:
        if not self.cfg.vad_commit:
            return
        wav = to_float32(np.concatenate(frames))  # the same samples as a preemptive reply's
        turn_id = None
        if self.cfg.auto_respond:  # else the next live update drops the fed turn
            # the preemptive reply's turn if it answers this audio, else the id the ASR was fed under
            turn_id = self._conv.adoptable(wav) or self._live.take()
        self._conv.commit(
            wav, speech_ms, self._turns.last_voiced_at, respond=self.cfg.auto_respond, turn_id=turn_id
        )
