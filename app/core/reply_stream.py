"""How a started reply runs: its pipeline events into the playout buffer, the history and the session's
events, its server-run tool calls and their continuation, and how it ends.

:class:`ReplyStreams` is the base of :class:`~omniduplex.app.core.conversation.Conversation`: the
conversation starts a reply and hands its event stream to :meth:`ReplyStreams._consume`, which drains it
to the end even after a barge-in (the user's transcript stands even if the reply is cut). Reply text becomes
``ReplyText``, audio goes to the playout buffer (with its words, for captions and truncation), function calls
go to :class:`~omniduplex.app.core.tool_turns.ToolCalls`; after server-run calls the reply goes on in a
continuation request. :meth:`ReplyStreams._end_reply` emits ``ReplyEnded`` with what the user heard.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import numpy as np

from omniduplex.app.core.events import (
    EndReason,
    ReplyEnded,
    ReplySpoken,
    ReplyText,
    SessionError,
    SessionEvent,
    UserTranscriptEvent,
)
from omniduplex.app.core.history import Entry, History
from omniduplex.app.core.playout import PlayoutBuffer
from omniduplex.app.core.replies import (
    ReplyAudioChunk,
    ReplyDone,
    ReplyEvent,
    ReplyFailed,
    ReplyTextDelta,
    Responder,
    UserTranscript,
)
from omniduplex.app.core.reply import Reply
from omniduplex.app.core.session_config import SessionConfig, SessionStats
from omniduplex.app.core.tool_turns import ToolCalls
from omniduplex.app.core.tools import CallArgumentsDelta, CallDone, CallFailed, CallStarted

log = logging.getLogger("omniduplex.session")


class ReplyStreams:
    """The reply-running half of a :class:`~omniduplex.app.core.conversation.Conversation` (its base
    class), over the conversation's state below. Call from the event loop thread."""

    name: str
    responder: Responder
    emit: Callable[[SessionEvent], None]
    cfg: SessionConfig
    stats: SessionStats
    clock: Callable[[], float]
    playout: PlayoutBuffer
    history: History
    calls: ToolCalls
    reply: Reply | None  # the reply playing or stopping
    keys: dict[tuple[str, str], int]  # (turn id, role) → its history entry's key
    closed: bool

    def _set_key(self, turn_id: str, role: str, entry: Entry | None) -> None:
        if entry is None:
            self.keys.pop((turn_id, role), None)
        else:
            self.keys[(turn_id, role)] = entry.key

    def _end_stopped_reply(self) -> None:
        r = self.reply
        if r is not None and r.interrupted_at is not None:  # its stop frame never pulled
            self._end_reply(r, "interrupted", stop_ms=1000.0 * (self.clock() - r.interrupted_at))

    async def _consume(self, r: Reply, stream: AsyncIterator[ReplyEvent] | None) -> None:
        """Move one reply's stream into the playout buffer (and its continuations' after server-run
        calls); drains to the end even after a barge-in."""
        try:
            while stream is not None:
                stream = await self._drain(r, stream)
        except Exception as e:
            log.exception("%s: reply stream failed", r.turn_id)
            if self.reply is r and r.interrupted_at is None:
                self.playout.flush()
                self._end_reply(r, "error", error=str(e))

    def _current(self, r: Reply) -> bool:
        return self.reply is r and r.interrupted_at is None and not self.closed

    async def _drain(
        self, r: Reply, stream: AsyncIterator[ReplyEvent], final: bool = True
    ) -> AsyncIterator[ReplyEvent] | None:
        """Consume one pipeline request of reply ``r``; the stream of its continuation when the reply goes on
        after server-run calls (:mod:`.tools`), else ``None``; ``final=False``: a call's filler."""
        done, failed = False, None
        async for ev in stream:
            if isinstance(ev, UserTranscript):  # what the user said stands even if the reply is cut
                if not r.segments:  # (a continuation after tool calls answers no new user words)
                    self._user_transcript(r, ev)
                continue
            if self.reply is not r or r.interrupted_at is not None or self.closed:
                continue
            if isinstance(ev, ReplyTextDelta):
                r.text.append(ev.text)
                self.emit(ReplyText(self.name, r.turn_id, ev.text))
            elif isinstance(ev, (CallStarted, CallArgumentsDelta, CallDone, CallFailed)):
                self.calls.on_event(r, ev)
            elif isinstance(ev, ReplyAudioChunk):
                r.generated += self.playout.push(ev.pcm)
                if ev.text:
                    r.chunks.append((r.generated, ev.text))
            elif isinstance(ev, ReplyDone):
                done = True
            elif isinstance(ev, ReplyFailed):
                failed = ev
        if failed is not None:
            await self._failed(r, failed, final)
            return None
        if (r.calls or r.repeated) and done:  # a repeated call is not run: the reply goes on without a tool
            say = lambda text: self._drain(r, self.calls.say(r, text, self.responder), False)  # noqa: E731
            apologised = await self.calls.run(r, say)  # outputs recorded even if the reply was interrupted
            if self._current(r) and not (r.client_calls or apologised):  # client calls: it asks for more
                return self._continue(r)
        if done and final and self._current(r):
            r.generated += self.playout.push(np.zeros(0, np.float32), last=True)
            r.generation_done = True
        return None

    async def _failed(self, r: Reply, ev: ReplyFailed, final: bool) -> None:
        """Reply ``r`` failed in the pipeline (``ev``): what is queued is dropped; with
        ``cfg.failure_apology`` the apology is said (the reply ends with reason ``error`` once it has played,
        :meth:`Conversation.pull`), else the reply ends now."""
        log.error("%s: the reply failed%s: %s", r.request_id, f" in {ev.stage}" if ev.stage else "", ev.error)
        self.playout.flush()
        apology = self.cfg.failure_apology
        if not apology or not final or r.failed:  # no apology, or the apology itself failed
            self._end_reply(r, "error", error=ev.error)
            return
        r.failed = ev.error
        kept = self._kept_text(r)  # what was heard stays; what was flushed was never said
        r.text, r.chunks, r.spoken, r.generated = ([kept + " "] if kept else []), [], 0, r.played
        await self._drain(r, self.calls.say(r, apology, self.responder), False)
        if self._current(r):
            r.generated += self.playout.push(np.zeros(0, np.float32), last=True)
            r.generation_done = True

    def _continue(self, r: Reply) -> AsyncIterator[ReplyEvent] | None:
        """Reply ``r``'s continuation after its calls ran (``None``: refused, the reply ends as it stands)."""
        try:
            return self.calls.continue_reply(r, self.responder)
        except Exception as e:
            log.exception("%s: could not continue after its calls", r.request_id)
            self.emit(SessionError(self.name, message=f"could not continue after tool calls: {e}"))
            r.generated += self.playout.push(np.zeros(0, np.float32), last=True)
            r.generation_done = True
            return None

    def _user_transcript(self, r: Reply, ev: UserTranscript) -> None:
        text = ev.text.strip()
        key = self.keys.get((r.turn_id, "user"))
        if self.history.get(key) is not None:
            self._set_key(r.turn_id, "user", self.history.set_text(key, text))
        elif text:
            self._set_key(r.turn_id, "user", self.history.add("user", text))
        self.emit(UserTranscriptEvent(self.name, r.turn_id, text=text, words=list(ev.words)))

    def _kept_text(self, r: Reply) -> str:
        """What the user heard of a stopped reply: a prefix of its generated text (module docstring)."""
        return r.kept_text(self.cfg.output_rate)

    def _captions(self, r: Reply) -> None:
        """Emit :class:`ReplySpoken` for each aligned chunk whose audio has started playing."""
        for said, start in r.due_captions():
            self.emit(ReplySpoken(self.name, r.turn_id, text=said, at_ms=self._ms(start)))

    def _end_reply(self, r: Reply, reason: EndReason, stop_ms: float | None = None, error: str = "") -> None:
        if self.reply is not r:
            return
        self.reply, r.ended = None, True
        text = r.full_text
        if reason == "completed" or r.failed:  # (a failed reply's apology was played to its end)
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
                self.name,
                r.turn_id,
                reason=reason,
                played_ms=self._ms(r.played),
                generated_ms=self._ms(r.generated),
                text="".join(r.text),
                kept_text=kept,
                stop_ms=stop_ms,
                error=error,
            )
        )

    def _samples(self, ms: float) -> int:
        return round(ms * self.cfg.output_rate / 1000.0)

    def _ms(self, samples: int) -> float:
        return 1000.0 * samples / self.cfg.output_rate
