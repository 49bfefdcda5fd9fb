"""The conversation: replies from start to end, the history, and truncation to what was played.

A committed user turn is recorded in the :class:`~omniduplex.app.core.history.History` (a placeholder until
the pipeline's ASR transcript comes; an empty transcript removes it) and answered by the
:class:`~omniduplex.app.core.replies.Responder`. The reply's audio waits in the
:class:`~omniduplex.app.core.playout.PlayoutBuffer` until the transport pulls it, one frame per frame period.
How a started reply's stream is consumed (text, audio, tool calls and their continuation) and how a reply
ends is its base class's, :class:`~omniduplex.app.core.reply_stream.ReplyStreams`.

A reply ends ``completed`` (all its audio pulled), ``interrupted`` (barge-in, :meth:`Conversation.cancel`
or a truncation: the playout is flushed at once, the pipeline request cancelled, and the reply ends on the
next pull: that frame is silence), ``error`` or ``closed``. The history keeps what the user heard of it:
all of a completed reply; of an interrupted one, the words of its played audio, by the audio stage's
text↔audio alignment when its chunks carry their words
(:func:`~omniduplex.app.core.history.truncate_aligned`), else in proportion to played audio
(:func:`~omniduplex.app.core.history.truncate_reply`). Either way the kept text is a prefix of the generated
text, whitespace included. :meth:`Conversation.truncate` (a client saying how much it really played) may
come at any time: while the reply plays (it is stopped first), while it is ending, or after it ended.

Preemptive generation (:meth:`Conversation.speculate`, :mod:`.preemptive`): during a pause that may end the
user's turn, the reply to the turn so far is started and its events are held; :meth:`Conversation.respond`
adopts it when the turn ends as it answers (:meth:`Conversation.adoptable`), else it is cancelled unseen.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from omniduplex.app.core.audio.pcm import SAMPLE_RATE
from omniduplex.app.core.events import (
    BargeIn,
    ReplyAudioStarted,
    ReplyStarted,
    SessionError,
    SessionEvent,
    UserTurnCommitted,
)
from omniduplex.app.core.history import Entry, History
from omniduplex.app.core.playout import PlayoutBuffer
from omniduplex.app.core.preemptive import Speculation
from omniduplex.app.core.replies import ReplyEvent, Responder
from omniduplex.app.core.reply import Reply, ReplyRecord
from omniduplex.app.core.reply_stream import ReplyStreams
from omniduplex.app.core.session_config import SessionConfig, SessionStats
from omniduplex.app.core.tool_turns import ToolCalls
from omniduplex.app.core.tools import ToolRunner

log = logging.getLogger("omniduplex.session")


class Conversation(ReplyStreams):
    """The replies and history of one session. Call from the event loop thread.

    Args:
        name: names the session; turn ids are ``{name}-{n}``.
        responder: where replies come from (shared by sessions).
        emit: receives every event; must not block.
        cfg: the session's settings (read live: ``instructions``, ``user_text``).
        stats: counters to add to.
        clock: monotonic seconds.
        tool_runner: runs the replies' function calls on the server (``None``: the client runs them;
            :mod:`.tools`).
    """

    def __init__(
        self,
        name: str,
        responder: Responder,
        emit: Callable[[SessionEvent], None],
        cfg: SessionConfig,
        stats: SessionStats,
        clock: Callable[[], float],
        tool_runner: ToolRunner | None = None,
    ) -> None:
        self.name, self.responder, self.emit, self.cfg, self.stats, self.clock = (
            name, responder, emit, cfg, stats, clock
        )
        self.t0 = clock()
        self.playout = PlayoutBuffer(responder.output_rate, cfg.output_rate)
        self.history = History(cfg.history_entries)
        self.calls = ToolCalls(name, self.history, emit, cfg, tool_runner, clock)
        self.reply: Reply | None = None  # the reply playing or stopping
        self.pending: tuple[str, np.ndarray] | None = None  # a committed turn not answered yet
        self.speculation: Speculation | None = None  # a reply started before its turn ended (.preemptive)
        self.replies: OrderedDict[str, Reply] = OrderedDict()  # recent replies, newest last (truncate)
        self.keys: dict[tuple[str, str], int] = {}  # (turn id, role) → its history entry's key
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        self._turn_numbers = itertools.count(1)

    # -- state ---------------------------------------------------------------------------------------
    @property
    def replying(self) -> bool:
        """A reply is pending or playing and has not been interrupted."""
        return self.reply is not None and self.reply.interrupted_at is None

    def entry(self, turn_id: str, role: str) -> Entry | None:
        """The history entry of turn ``turn_id``'s ``role`` (``user`` / ``assistant``), if held."""
        return self.history.get(self.keys.get((turn_id, role)))

    def record(self, turn_id: str) -> ReplyRecord | None:
        """What reply ``turn_id`` became so far (``None``: unknown, or too old)."""
        r = self.replies.get(turn_id)
        if r is None:
            return None
        entry = self.entry(turn_id, "assistant")
        kept = entry.text if entry else ""
        return ReplyRecord(turn_id, r.full_text, kept, self._ms(r.played), self._ms(r.generated), r.ended)

    # -- turns and replies ---------------------------------------------------------------------------
    def new_turn_id(self) -> str:
        """A fresh turn id (``{name}-{n}``), e.g. for a turn fed to the ASR while it is spoken."""
        return f"{self.name}-{next(self._turn_numbers)}"

    def commit(
        self, wav: np.ndarray, speech_ms: float, speech_end: float, respond: bool, turn_id: str | None = None
    ) -> str:
        """Close a spoken user turn (``wav``: 16 kHz mono float32; ``speech_end``: clock time its speech
        ended): record it (a placeholder until its transcript comes) and, with ``respond``, start the reply
        to it at once; otherwise it waits for :meth:`respond`. ``turn_id``: the id reserved for it
        (:meth:`new_turn_id`; default a new one). Returns the turn id."""
        self._end_stopped_reply()
        turn_id = turn_id or self.new_turn_id()
        user_text = self.cfg.user_text.format(seconds=speech_ms / 1000.0)
        self._set_key(turn_id, "user", self.history.add("user", user_text))
        self.pending = (turn_id, wav)
        self.emit(
            UserTurnCommitted(
                self.name,
                turn_id,
                audio_ms=1000.0 * wav.size / SAMPLE_RATE,
                speech_ms=speech_ms,
                speech_end_at_ms=1000.0 * (speech_end - self.t0),
                text=user_text,
            )
        )
        if respond:
            self.respond(speech_end=speech_end)
        return turn_id

    def _options(
        self,
        instructions: str | None = None,
        metadata: dict[str, Any] | None = None,
        tools: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        options: dict[str, Any] = {"metadata": dict(metadata or {}), **self.calls.offer(tools)}
        if self.cfg.instructions:
            options["system_prompt"] = self.cfg.instructions
        if instructions:
            options["instructions"] = instructions
        if self.cfg.voice:
            options["voice"] = self.cfg.voice
        return options

    def prefill_context(self) -> tuple[list[list[str]], dict[str, Any]]:
        """``(history, options)`` a spoken turn committed now would be started with (before its own text
        joins the history): what the LLM may prefill while the user is still speaking."""
        return self.history.snapshot(), self._options()

    def respond(
        self,
        instructions: str | None = None,
        metadata: dict[str, Any] | None = None,
        speech_end: float | None = None,
        tools: dict[str, Any] | None = None,
    ) -> str | None:
        """Start a reply now (a reply in flight is cancelled first); returns its turn id, or ``None`` when
        the responder refused it (a ``SessionError`` is emitted).

        It answers the committed spoken turn that has no reply yet, if any; otherwise the conversation as
        it stands (a trailing typed user message is the turn's text). ``instructions`` add to the system
        prompt for this reply only; ``metadata`` travels with the turn. ``speech_end``: clock time the
        user's speech ended (latency is measured from it; default: now). ``tools``: this reply's own
        ``{"tools", "tool_choice"}`` (replacing the session's; :meth:`.tool_turns.ToolCalls.offer`).
        """
        now = self.clock()
        if self.replying:
            self.cancel()
        self._end_stopped_reply()
        options = self._options(instructions, metadata, tools)
        history = self.history.snapshot()
        spec, self.speculation = self.speculation, None
        if self.pending is not None:
            (turn_id, wav), self.pending = self.pending, None
            key = self.keys.get((turn_id, "user"))
            history = [e.wire() for e in self.history.entries if e.key != key]
            if spec is not None and (spec.turn_id, spec.history, spec.options) == (turn_id, history, options):
                return self._start_reply(turn_id, wav, now, speech_end, metadata, spec.events(), options)
        else:
            turn_id, wav = f"{self.name}-{next(self._turn_numbers)}", np.zeros(0, np.float32)
            entries = self.history.entries
            last = entries[-1] if entries and entries[-1].role == "user" else None
            options["user_text"] = last.text if last else ""
            if last is not None:
                history = history[:-1]
                self.keys[(turn_id, "user")] = last.key
        if spec is not None:
            self.responder.cancel(spec.turn_id)
        try:
            self.responder.start(turn_id, wav, history, options)
        except Exception as e:
            log.exception("%s: could not start turn", turn_id)
            self.emit(SessionError(self.name, message=f"could not start turn: {e}"))
            return None
        stream = self.responder.events(turn_id)
        return self._start_reply(turn_id, wav, now, speech_end, metadata, stream, options)

    def _start_reply(self, turn_id: str, wav: np.ndarray, now: float, speech_end: float | None,
                     metadata: dict[str, Any] | None, stream: AsyncIterator[ReplyEvent],
                     options: dict[str, Any]) -> str:
        """Make the started request ``turn_id`` the reply in flight, consuming ``stream`` (its events)."""
        self.stats.turns += 1
        end = speech_end if speech_end is not None and wav.size else now
        r = self.reply = Reply(turn_id, t_commit=now, t_speech_end=end, options=options)
        self.replies[turn_id] = r
        while len(self.replies) > max(1, self.cfg.history_entries):
            self.replies.popitem(last=False)
        self.emit(ReplyStarted(self.name, turn_id, metadata=dict(metadata or {})))
        task = asyncio.get_running_loop().create_task(self._consume(r, stream), name=f"reply-{turn_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return turn_id

    # -- preemptive generation -----------------------------------------------------------------------
    def speculate(self, turn_id: str, wav: np.ndarray) -> bool:
        """Start the reply to a spoken turn that has not ended yet (``wav``: its audio so far, 16 kHz mono
        float32), holding its events; :meth:`respond` adopts it if the turn is committed under ``turn_id``
        with the same audio and context, :meth:`drop_speculation` cancels it. ``False`` (nothing started)
        while a reply or a committed turn is in flight, a speculation is held, or the responder refused."""
        if self.replying or self.pending is not None or self.speculation is not None or self.closed:
            return False
        self._end_stopped_reply()
        history, options = self.history.snapshot(), self._options()
        try:
            self.responder.start(turn_id, wav, history, options)
        except Exception:
            log.exception("%s: could not start the preemptive reply; the turn starts when it ends", turn_id)
            return False
        spec = self.speculation = Speculation(turn_id, wav.copy(), history, options)
        task = asyncio.get_running_loop().create_task(spec.hold(self.responder), name=f"preempt-{turn_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    def adoptable(self, wav: np.ndarray) -> str | None:
        """The turn id of the held speculation when a turn ending now with audio ``wav`` is the one it
        answers (same samples, same history and options); otherwise the speculation is cancelled and
        ``None`` returned."""
        spec = self.speculation
        if spec is None:
            return None
        if spec.answers(wav, self.history.snapshot(), self._options()):
            return spec.turn_id
        self.drop_speculation()
        return None

    def drop_speculation(self) -> bool:
        """Cancel the held speculation (its events are drained and discarded); ``False`` when none."""
        spec, self.speculation = self.speculation, None
        if spec is None:
            return False
        self.responder.cancel(spec.turn_id)
        return True

    def barge_in(self, now: float, speech_ms: float) -> None:
        """Stop the reply playing now: playout flushed, pipeline turn cancelled, the history keeps what was
        played; it ends on the next pull. ``speech_ms``: the user speech that caused it (0: not speech)."""
        r = self.reply
        if r is None or r.interrupted_at is not None:
            return
        r.interrupted_at = now
        self.playout.flush()
        self.responder.cancel(r.request_id)
        self._set_key(r.turn_id, "assistant", self.history.add("assistant", self._kept_text(r)))
        self.stats.barge_ins += 1
        self.emit(BargeIn(self.name, r.turn_id, speech_ms=speech_ms, played_ms=self._ms(r.played)))

    def cancel(self) -> bool:
        """Stop the reply in flight as a barge-in would; ``False`` when nothing is playing or pending."""
        if not self.replying:
            return False
        self.barge_in(self.clock(), speech_ms=0.0)
        return True

    def truncate(self, turn_id: str, audio_end_ms: float) -> str | None:
        """The client played only ``audio_end_ms`` ms of reply ``turn_id``: the history keeps the words of
        that audio. A reply still playing is stopped first (:meth:`cancel`); one that is stopping or has
        ended is truncated as it stands, so this works in any order relative to the reply's end. Returns
        the kept text (a prefix of the generated text; "" = nothing kept, the entry is removed), or
        ``None`` for an unknown turn.

        Raises:
            ValueError: ``audio_end_ms`` is negative or past the end of the reply's audio.
        """
        r = self.replies.get(turn_id)
        if r is None:
            return None
        if audio_end_ms < 0 or self._samples(audio_end_ms) > r.generated + 1:
            end = self._ms(r.generated)
            raise ValueError(f"audio_end_ms {audio_end_ms:.0f} is past the reply's audio (0 … {end:.0f} ms)")
        if r is self.reply and r.interrupted_at is None:
            self.barge_in(self.clock(), speech_ms=0.0)
        r.played = min(r.played, self._samples(audio_end_ms))
        kept = self._kept_text(r)
        key = self.keys.get((turn_id, "assistant"))
        if self.history.get(key) is not None:
            self._set_key(turn_id, "assistant", self.history.set_text(key, kept))
        else:
            self._set_key(turn_id, "assistant", self.history.add("assistant", kept))
        return kept

    def forget(self, turn_id: str, role: str) -> bool:
        """Drop turn ``turn_id``'s ``role`` entry from the history; ``False`` when there is none."""
        return self.history.remove(self.keys.pop((turn_id, role), None))

    def pull(self, n: int) -> tuple[np.ndarray, int]:
        """The next ``n`` output samples (int16 at ``cfg.output_rate``, silence past the reply's audio) and
        how many of them are reply audio. Ends the reply that has stopped or played to its end."""
        now = self.clock()
        out, filled = self.playout.read(n)
        r = self.reply
        if r is None:
            return out, filled
        if r.interrupted_at is not None:  # the first frame after a barge-in: playback has stopped
            self._end_reply(r, "interrupted", stop_ms=1000.0 * (now - r.interrupted_at))
            return out, filled
        if filled:
            r.played += filled
            self._captions(r)
            if r.t_first_audio is None:
                r.t_first_audio = now
                latency = 1000.0 * (now - r.t_speech_end)
                self.stats.latency_ms.append(latency)
                commit_ms = 1000.0 * (now - r.t_commit)
                self.emit(
                    ReplyAudioStarted(self.name, r.turn_id, latency_ms=latency, commit_to_audio_ms=commit_ms)
                )
                log.info("%s: first reply audio %.0f ms after end of speech", r.turn_id, latency)
        if r.generation_done and self.playout.queued == 0:
            self._set_key(r.turn_id, "assistant", self.history.add("assistant", r.full_text))
            self._end_reply(r, "error" if r.failed else "completed", error=r.failed)
        return out, filled

    async def close(self) -> None:
        """Cancel the reply in flight and wait (up to 5 s) for its stream to end. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.drop_speculation()
        r = self.reply
        if r is not None:
            self.responder.cancel(r.request_id)
            self.playout.flush()
            if r.interrupted_at is not None:
                self._end_reply(r, "interrupted", stop_ms=1000.0 * (self.clock() - r.interrupted_at))
            else:
                self._end_reply(r, "closed")
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=5.0)
            for t in pending:
                t.cancel()

