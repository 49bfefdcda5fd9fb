"""One reply's text as the LLM stage emits it: spoken text deltas and tool-call events, in message meta.

:class:`ReplyStream` takes the model's text deltas (one per sampled token on our engine and vLLM, one per
streamed chunk from an OpenAI-compatible server) and returns the meta of the messages to send, each a dict
with ``text`` (the delta to say, maybe ``""``) and at most one event per ``tool_call_*`` key
(:mod:`.tool_calls`), events before text. It joins three policies:

* calls (when the turn offers tools): :class:`~.tool_calls.ToolCallParser` splits call blocks off the text;
  the text said before a call is released whole when the call starts (its order against the call is kept);
* the ear (:class:`~omniduplex.pipeline.text.spoken.SpokenReply`, for speech turns): the speakable-text
  stage (:mod:`omniduplex.pipeline.text.speakable`: no code, JSON, tables or markdown; numbers, dates and
  symbols in words), at most a few sentences (the reply ends after its sentence budget), the reply cut at
  its last complete clause when the token budget runs out;
* limits: ``text_budget`` tokens of text outside call blocks (a call's own tokens do not count, so a long
  call does not eat the spoken answer), and at most ``max_calls`` calls: :attr:`ReplyStream.stop` then says
  why the generation should end now (``"length"`` / ``"tool_calls"``), and the stage ends it.

Finish reasons reported (:meth:`ReplyStream.finish`): ``stop`` (the model ended), ``tool_calls`` (it ended
after making calls, or the call limit was reached), ``length`` (the token budget ran out).
"""

from __future__ import annotations

from omniduplex.pipeline.events import CallFailed
from omniduplex.pipeline.stages.tool_calls import (
    DONE,
    EVENT_KEYS,
    FAILED,
    REPEAT_ERROR,
    STARTED,
    ToolCallParser,
    call_key,
)
from omniduplex.pipeline.text.spoken import SpokenReply


class ReplyStream:
    """Text deltas → message meta (see the module docstring).

    Args:
        speech: the reply is spoken (:class:`SpokenReply`: markdown stripped, cut at a clause on ``length``);
            ``False`` passes the text through as written.
        calls: parse call blocks out of the text (the turn offers tools).
        max_calls: most calls this reply may make (``None``: no limit; ``0``: none, a block the model writes
            anyway ends a ``CallFailed``).
        text_budget: most tokens of text outside call blocks (``None``: the engine's ``max_tokens`` alone).
        made: :func:`~.tool_calls.call_key` of the calls the turn has made already; a call repeating one
            (or one earlier in this reply) ends a ``CallFailed`` (:data:`~.tool_calls.REPEAT_ERROR`)
            and the reply ends: one call per need.
        answered: names of the functions that returned a result in this turn already
            (:func:`~omniduplex.models.cascade.tool_prompt.answered_since_user`): a call of one, with any
            arguments, is refused the same way (``bench tools``: Qwen2.5-Coder-0.5B called the unit converter
            again with other numbers instead of saying its result). Refused rather than masked out: a grammar
            without the function turned the model's repeat into calls of other tools.
        finish_sentence: once ``text_budget`` is spent, a spoken reply with a sentence budget ends after the
            sentence being said instead of at once (the engine's ``max_tokens`` then holds a grace beyond the
            budget, :data:`~omniduplex.pipeline.stages.chat_prompt.SENTENCE_GRACE_TOKENS`): never cut
            mid-sentence unless the grace runs out too.
        max_sentences: most sentences a spoken reply says (:func:`~omniduplex.pipeline.text.spoken.
            sentence_budget`); once said, :attr:`stop` is ``"stop"`` (the reply is complete).
        filler: words said once, as the reply opens a call of one of ``filler_for`` (the session's
            server-run tools); the ``CallStarted`` of that call names it (``filler``). On a CPU the call takes
            a second or two to write and the tool its own time: the line is not silent meanwhile.
        filler_for: the function names whose calls get the filler: the filler is the text of the message
            that carries the call's ``CallStarted``; ``None``: every call (all the offered tools run on the
            server), and the filler goes out with the call's opener (``<tool_call>``), before its name.
    """

    def __init__(
        self,
        speech: bool = True,
        calls: bool = False,
        max_calls: int | None = None,
        text_budget: int | None = None,
        max_sentences: int | None = None,
        made: set | frozenset = frozenset(),
        finish_sentence: bool = False,
        answered: frozenset[str] = frozenset(),
        filler: str = "",
        filler_for: frozenset[str] | None = frozenset(),
    ) -> None:
        self.answered = answered
        self.filler, self.filler_for = filler, filler_for
        self.filler_said = ""  # said at a call's opener, not yet named by its CallStarted
        self.spoken = SpokenReply(strip=speech, max_sentences=max_sentences) if speech else None
        self.max_sentences = max_sentences
        self.made = set(made)  # call_key of the calls the turn has made (one call per need)
        self.finish_sentence = finish_sentence
        self.parser = ToolCallParser() if calls else None
        self.max_calls, self.text_budget = max_calls, text_budget
        self.text_tokens = 0
        self.stop: str | None = None
        self.calls = 0  # calls done (or failed)
        self.done = 0  # calls done

    @property
    def unspoken(self) -> str:
        """The text dropped after the last complete clause when the reply ran out of tokens."""
        return self.spoken.unspoken if self.spoken else ""

    def _repeats(self, done) -> bool:
        """Whether a finished call repeats one of the turn (same call, or a function already answered)."""
        return call_key(done.name, done.arguments) in self.made or done.name in self.answered

    def push(self, delta: str, tokens: int = 1) -> list[dict]:
        """Add the text of ``tokens`` sampled tokens; the meta of the messages to send (at least one)."""
        was_in_block = self.parser is not None and self.parser.in_block
        segments = self.parser.push(delta) if self.parser else [("text", delta)]
        opened = self.parser is not None and not was_in_block and self.parser.in_block
        if opened and self.filler and self.filler_for is None:  # any call gets it: say it at the opener
            self.filler_said, self.filler = self.filler, ""
            metas = self.push_segments(segments, tokens, was_in_block)
            metas[-1]["text"] += self._before_call() + self.filler_said + " "
            return metas
        return self.push_segments(segments, tokens, was_in_block)

    def push_segments(self, segments: list, tokens: int = 0, was_in_block: bool = False) -> list[dict]:
        """Add parsed segments (``("text", str)`` or ``(tool_call_* key, event)``, as
        :class:`~.tool_calls.ToolCallParser` gives them, or as a server's structured call deltas become) of
        ``tokens`` tokens; the meta of the messages to send (at least one)."""
        metas = self._pack(segments)
        in_block = self.parser is not None and self.parser.in_block
        if not was_in_block and not in_block and all(k == "text" for k, _ in segments):
            self.text_tokens += tokens
        if self.text_budget is not None and self.text_tokens >= self.text_budget and not in_block:
            spoken = self.spoken
            if self.finish_sentence and spoken is not None and spoken.max_sentences is not None:
                spoken.max_sentences = min(spoken.max_sentences, spoken.sentences + 1)  # end after this one
            else:
                self.stop = self.stop or "length"
        if self.max_calls and self.calls >= self.max_calls:
            self.stop = self.stop or "tool_calls"
        if self.spoken is not None and self.spoken.full and not in_block:
            self.stop = self.stop or "stop"  # the sentence budget is said: the reply is complete
        return metas

    def finish(self, reason: str | None) -> tuple[list[dict], str]:
        """End of the reply (``reason``: the engine's ``stop`` / ``length``, or :attr:`stop` when the stage
        ended it); the last messages' meta and the finish reason to report."""
        reason = self.stop or reason or "stop"
        segments = self.parser.finish() if self.parser else []
        metas = self._pack(segments)
        tail = self.spoken.finish(reason) if self.spoken else ""
        metas[-1]["text"] += tail
        if reason == "stop" and self.done:
            reason = "tool_calls"
        return metas, reason

    def _before_call(self) -> str:
        """The rest of what was said before a call, complete (the spoken text starts afresh after it)."""
        if self.spoken is None:
            return ""
        rest = self.spoken.finish("stop")
        self.spoken = SpokenReply(self.spoken.md is not None, self.max_sentences)
        return rest

    def _fills(self, name: str) -> bool:
        """Whether a call of ``name`` gets the filler (``filler_for`` ``None``: every call)."""
        return self.filler_for is None or name in self.filler_for

    def _say(self, text: str) -> str:
        return self.spoken.push(text) if self.spoken else text

    def _pack(self, segments) -> list[dict]:
        out: list[dict] = [{"text": ""}]
        for key, value in segments:
            if key == "text":
                out[-1]["text"] += self._say(value)
                continue
            if key == STARTED:
                out[-1]["text"] += self._before_call()
            if key == DONE and self.max_calls == 0:  # tool_choice none: a block written anyway is no call
                refused = "no tool call is allowed in this reply"
                key, value = FAILED, CallFailed(value.call_id, value.name, refused)
            elif key == DONE and self._repeats(value):  # one call per need
                key, value = FAILED, CallFailed(value.call_id, value.name, REPEAT_ERROR)
                self.stop = self.stop or ("tool_calls" if self.done else "stop")  # the model is looping
            elif key == DONE:
                self.made.add(call_key(value.name, value.arguments))
            if key in (DONE, FAILED):
                self.calls += 1
                self.done += key == DONE
            rank = EVENT_KEYS.index(key)
            if out[-1]["text"] or any(EVENT_KEYS.index(k) >= rank for k in out[-1] if k in EVENT_KEYS):
                out.append({"text": ""})  # each message: events in EVENT_KEYS order, then text
            out[-1][key] = value
            if key == STARTED and self.filler_said:  # said at its opener
                value.filler, self.filler_said = self.filler_said, ""
            elif key == STARTED and self.filler and self._fills(value.name):
                value.filler, self.filler = self.filler, ""  # once per reply
                out[-1]["text"] += value.filler + " "
        return out
