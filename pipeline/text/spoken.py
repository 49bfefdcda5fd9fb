"""Replies for the ear: the cascade's default system prompt, markdown stripped before speech, and a reply that
never stops mid-sentence.

A voice assistant's reply is heard, not read: a numbered list or ``**bold**`` read out is noise, and a reply
cut by its token budget mid-sentence ("3. Once") sounds broken. Three parts, all pure policy:

* :data:`SPOKEN_SYSTEM_PROMPT` asks for short plain sentences, no lists or markdown;
* :func:`strip_markdown` removes what a model writes anyway: leading list markers (``1.``, ``2)``, ``-``,
  ``*``, ``+``, ``•``), heading hashes (``## ``), block quotes (``> ``) at the start of a line, number markers
  run into a line after a sentence end ("Boil water. 2. Add tea"), and emphasis
  and code markers (``*``, ``**``, ``__``, ``_`` at a word's edge, `````, ``~~``) anywhere; ``snake_case`` and
  ``-5`` stay. :class:`MarkdownStripper` does the same on a stream of deltas (the outputs of any split of a
  text, joined, equal ``strip_markdown`` of the text);
* :class:`SpokenReply` releases the (stripped) reply text for the TTS and the history: the first clause as it
  streams (the TTS cuts it early for time to first audio), then up to the last complete clause or sentence
  (:func:`~omniduplex.pipeline.text.clauses.clause_ends`), holding the rest until its clause completes.
  When the
  reply ends on its token budget (``length``), the held tail is dropped: what is said, and kept, ends at the
  last complete clause. A reply that ends naturally (``stop``) releases everything. The tool-result tags a
  small model copies into its answer (``<tool_response>``, :class:`EchoFilter`) are never said.
"""

from __future__ import annotations

import datetime
import re

from omniduplex.pipeline.text.clauses import ABBREVIATIONS, clause_ends
from omniduplex.pipeline.text.speakable import BlockFilter, Verbalizer

SPOKEN_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Your replies are spoken aloud, so always answer in English, in one "
    "to three short, plain sentences. Never use lists, numbered steps, headings or markdown: say it as a "
    "person would on the phone."
)
"""The cascade's default system prompt (what the user hears is speech: short sentences, no lists or
markdown; English, since the voice is English and SmolLM2 otherwise drifts into French when a question
mentions Paris)."""

TOOLS_PROMPT = (
    "You are a friendly voice assistant on a phone line. Most questions need no tool: answer them briefly "
    "yourself. Use a tool only when the caller asks you to {uses}; then reply with only a <tool_call> block. "
    "When a tool result arrives, say what it means for the caller in one short sentence."
)
"""The system prompt of turns that offer tools (:func:`spoken_tools_prompt` fills in what the tools do)."""


SENTENCES = 3
"""Most sentences of a spoken reply (:func:`sentence_budget`): "a few sentences unless asked for more"."""
SENTENCES_ASKED = 12
"""Most sentences when the user asks for more (a story, details, steps, a list)."""
_ASKS_MORE = re.compile(
    r"\b(?:in detail|detailed|explain|tell me (?:more|a story|about|everything)|story|step[- ]by[- ]step|"
    r"steps|list|describe|everything|all (?:the|of)|longer|elaborate|recipe|instructions)\b",
    re.I,
)


def sentence_budget(transcript: str) -> int:
    """Most sentences of the spoken reply to ``transcript``: :data:`SENTENCES`, or :data:`SENTENCES_ASKED`
    when the user asks for more ("tell me a story", "explain in detail", "step by step").

    >>> sentence_budget("What's the capital of France?"), sentence_budget("Explain how a bill becomes law")
    (3, 12)
    """
    return SENTENCES_ASKED if _ASKS_MORE.search(transcript or "") else SENTENCES


_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]”’]*(?=\s)")


def sentence_ends(text: str) -> list[int]:
    """Ends (exclusive) of the sentences of speakable ``text`` (no digits: :mod:`.speakable`): a ``.``,
    ``!``, ``?`` or ``…`` (with closing quotes) before whitespace, not after an abbreviation
    (``e.g.``, ``Dr.``) or initials (``U.S.``)."""
    out = []
    for m in _SENTENCE_END.finditer(text):
        if m.group().startswith(".") and len(m.group().rstrip("\"')]”’")) == 1:
            word = text[: m.start() + 1].split()[-1].lstrip("\"'(“‘").lower()
            if word in ABBREVIATIONS or re.fullmatch(r"(?:[a-z]\.)+", word) and len(word) <= 4:
                continue
        out.append(m.end())
    return out


DATE_DAYS = 7
"""Days after today that :func:`date_context` names with their weekday and date."""


def date_context(today: datetime.date, days: int = DATE_DAYS) -> str:
    """The date line of a system prompt whose tools take dates and times: today and the next ``days`` days
    with their weekdays and ISO dates (``YYYY-MM-DD``, the format of JSON Schema's ``date``), and that times
    are written on the 24-hour clock. A small model left to count days itself books "tomorrow" as today and
    "7 pm" as 17:00 (``bench tools``, ``MODELS.md``).

    >>> date_context(datetime.date(2026, 11, 27), days=2).split(". ")[:2]
    ['Today is Friday, 2026-11-27', 'Tomorrow is Saturday, 2026-11-28; then Sunday, 2026-11-29']
    """
    def day(k: int) -> str:
        d = today + datetime.timedelta(days=k)
        return f"{d.strftime('%A')}, {d.isoformat()}"

    after = "; then " + "; ".join(day(k) for k in range(2, days + 1)) if days > 1 else ""
    return (
        f"Today is {day(0)}. Tomorrow is {day(1)}{after}. "
        "Times are on the 24-hour clock: 1 pm is 13:00, 9 pm is 21:00."
    )


def spoken_tools_prompt(descriptions: list[str], date: str = "") -> str:
    """The system prompt for a spoken turn that offers tools, whose ``descriptions`` (one per tool, as in its
    definition) say what each does; ``date`` (a date line, e.g. :func:`date_context`) is appended when given.
    ``bench tools`` chose this form: on Qwen2.5-Coder-1.5B the plain spoken prompt made the model describe
    calls in words, and a prompt without the tools' uses made it call tools for general questions (figures in
    ``MODELS.md``).

    >>> spoken_tools_prompt(["Look up an order's status.", "The weather in a city."])[:60]
    'You are a friendly voice assistant on a phone line. Most que'
    """
    uses = "; ".join(d.strip().rstrip(".").lower() for d in descriptions if d.strip()) or "do something"
    return " ".join(p for p in (TOOLS_PROMPT.format(uses=uses), date) if p)


_MARK = r"(?:#{1,6}|[-*+•]|\d{1,3}[.)]|>)"
_LEADER = re.compile(rf"[ \t]*(?:{_MARK}(?:[ \t]+|(?=\n)|\Z))*")
"""Line-start markup: heading hashes, bullets, numbered-list markers and block quotes (nested), each followed
by spaces or the line's end, with the line's indentation."""
_MAYBE_LEADER = re.compile(rf"[ \t]*(?:{_MARK}[ \t]+)*(?:#{{1,6}}|[-*+•]|\d{{1,3}}[.)]?|>)?")
"""A line start that more text could still turn into (more) line-start markup."""
_INLINE = re.compile(r"\d{1,2}[.)][ \t]+")
_MAYBE_INLINE = re.compile(r"\d{1,2}[.)]?[ \t]*")
SENTENCE_ENDS = ".!?:,;"
"""After one of these and a space, ``2. `` starts a list item run into the line, and is dropped ("Boil water.
2. Add", and a small model's "just right, 2. Add a pinch")."""
DROPPED = "*`~"
"""Emphasis and code characters removed anywhere (``_`` only at a word's edge)."""


def _line_start(buf: str, i: int, final: bool) -> int | None:
    """End of the line-start markup of the line starting at ``buf[i]``; ``None`` while more text could
    change it (the rest of ``buf`` is a possible unfinished marker and the text goes on)."""
    m = _LEADER.match(buf, i)
    if not final:
        partial = _MAYBE_LEADER.match(buf, m.end())
        if partial.end() == len(buf):
            return None
    return m.end()


def _strip(buf: str, state: tuple[bool, str, str], final: bool) -> tuple[str, int, tuple[bool, str, str]]:
    """Strip what can be decided of ``buf``: ``(text, consumed, state)``; ``state`` is ``(at_line_start,
    prev, last)``: whether ``buf`` starts a line, the character before it (the word-edge test of ``_`` reads
    it) and the last non-space character kept (a number marker after a sentence end is a list item run into
    one line: "Boil water. 2. Add tea")."""
    at_line_start, prev, last = state
    out: list[str] = []
    i, n = 0, len(buf)
    while i < n:
        if at_line_start:
            end = _line_start(buf, i, final)
            if end is None:
                break
            i, at_line_start = end, False
            continue
        c = buf[i]
        if c.isdigit() and prev in " \t" and last in SENTENCE_ENDS:
            if not final and _MAYBE_INLINE.fullmatch(buf, i):
                break  # "2" or "2." may still become a marker
            m = _INLINE.match(buf, i)
            if m is not None:
                i, prev = m.end(), " "
                continue
        if c == "\n":
            out.append(c)
            at_line_start = True
        elif c in DROPPED:
            pass
        elif c == "_":
            if i + 1 == n and not final:
                break
            nxt = buf[i + 1] if i + 1 < n else " "
            if prev.isalnum() and nxt.isalnum():
                out.append(c)  # snake_case
        else:
            out.append(c)
        if not c.isspace() and c not in DROPPED:
            last = c
        prev = c
        i += 1
    return "".join(out), i, (at_line_start, prev, last)


def strip_markdown(text: str) -> str:
    """``text`` without markdown a voice should not read (see the module docstring).

    >>> strip_markdown("## Steps\\n1. **Boil** the water.\\n- Add the tea_leaves.")
    'Steps\\nBoil the water.\\nAdd the tea_leaves.'
    """
    return _strip(text, (True, " ", " "), True)[0]


class MarkdownStripper:
    """:func:`strip_markdown` over a stream of text deltas: ``push`` returns what can be decided, ``flush``
    the rest; joined, the outputs equal ``strip_markdown`` of the joined inputs."""

    def __init__(self) -> None:
        self.buf, self.state = "", (True, " ", " ")

    def push(self, delta: str) -> str:
        self.buf += delta
        out, used, self.state = _strip(self.buf, self.state, False)
        self.buf = self.buf[used:]
        return out

    def flush(self) -> str:
        out, _, self.state = _strip(self.buf, self.state, True)
        self.buf = ""
        return out


ECHO_TAGS = ("tool_response", "tool_error")
"""Tags a small model copies from its prompt into its answer (the tool results as
:mod:`omniduplex.models.cascade.tool_prompt` renders them): never to be read out."""
_ECHO_TAG = re.compile(r"</?(?:tool_response|tool_error)>")
_ECHO_TAGS = [f"<{t}>" for t in ECHO_TAGS] + [f"</{t}>" for t in ECHO_TAGS]
_ECHO_LONGEST = max(map(len, _ECHO_TAGS))


class EchoFilter:
    """Drops echoed tool-result tags (``<tool_response>``, ``</tool_error>``, ...) from a stream of text
    deltas, keeping what they enclose (the result in the model's words is often all it says: dropping the
    block would leave the reply silent). ``push`` returns what can be decided (a possible tag's start is held
    back), ``flush`` the rest. Joined, the outputs are the input without those tags, however it was split."""

    def __init__(self) -> None:
        self.buf = ""

    def push(self, delta: str, final: bool = False) -> str:
        self.buf += delta
        out = []
        while self.buf:
            i = self.buf.find("<")
            if i < 0:
                out.append(self.buf)
                self.buf = ""
                break
            out.append(self.buf[:i])
            rest = self.buf[i:]
            if m := _ECHO_TAG.match(rest):
                self.buf = rest[m.end() :]
                continue
            if not final and len(rest) < _ECHO_LONGEST and any(t.startswith(rest) for t in _ECHO_TAGS):
                self.buf = rest  # maybe a tag: wait for more
                break
            out.append("<")
            self.buf = rest[1:]
        return "".join(out)

    def flush(self) -> str:
        return self.push("", final=True)


class SpokenReply:
    """The reply text released to the TTS and the history (see the module docstring).

    Args:
        strip: make the text speakable (:mod:`.speakable`: code, JSON, tables and rules out, markdown
            stripped, numbers and symbols in words); ``False`` passes text through as written.
        max_sentences: most sentences said (:func:`sentence_budget`); the reply ends after the last one
            (:attr:`full`), never mid-sentence. ``None``: no limit.

    Attributes:
        unspoken: after :meth:`finish` with ``length``, the text dropped after the last complete clause; once
            :attr:`full`, the text written after the last sentence allowed.
        full: the sentence budget is spent: nothing more is said (the LLM stage ends the reply).
    """

    def __init__(self, strip: bool = True, max_sentences: int | None = None) -> None:
        self.md = MarkdownStripper() if strip else None
        self.blocks = BlockFilter() if strip else None
        self.words = Verbalizer() if strip else None
        self.max_sentences, self.sentences, self.full = max_sentences, 0, False
        self.said, self.counted = "", 0  # text released so far; the last sentence end counted in it
        self.echo = EchoFilter()  # copied tool results are never said
        self.text = ""  # all (stripped) text so far
        self.released = 0  # characters of text released
        self.first_done = False  # a clause boundary has been seen: hold back from now on
        self.base = 0  # the last clause end found (cuts before it never change: scans start here)
        self.unspoken = ""

    def push(self, delta: str) -> str:
        """Add reply text; the text to say now."""
        if self.full:
            self.unspoken += delta
            return ""
        delta = self.echo.push(delta)
        new = self.words.push(self.md.push(self.blocks.push(delta))) if self.md else delta
        if not new:
            return ""
        self.text += new
        end = self._clause_end(final=False)
        if not self.first_done and end == 0:
            out, self.released = self.text[self.released :], len(self.text)  # the first clause streams
            return self._budget(out)
        self.first_done = True
        return self._release(end)

    def _budget(self, out: str) -> str:
        """``out`` (text being released) cut after the last sentence the budget allows (:attr:`full` then)."""
        if self.max_sentences is None or self.full:
            return out
        said, self.said = self.said, self.said + out
        for end in sentence_ends(self.said):
            if end <= self.counted:
                continue
            self.counted, self.sentences = end, self.sentences + 1
            if self.sentences >= self.max_sentences:
                cut = max(0, end - len(said))
                self.full, self.unspoken = True, out[cut:]
                return out[:cut]
        return out

    def _clause_end(self, final: bool) -> int:
        found = clause_ends(self.text[self.base :], final)
        if found:
            self.base += found
        return self.base

    def _release(self, end: int) -> str:
        if end <= self.released:
            return ""
        out, self.released = self.text[self.released : end], end
        return self._budget(out)

    def finish(self, reason: str | None) -> str:
        """End of the reply: the text still to say. ``reason == "length"`` (token budget): up to the last
        complete clause only, the rest kept in :attr:`unspoken`; otherwise everything."""
        if self.full:
            return ""
        rest = self.echo.flush()
        if self.md is not None:
            rest = self.md.push(self.blocks.push(rest, final=True)) + self.md.flush()
            self.text += self.words.push(rest, final=True)
        else:
            self.text += rest
        if reason == "length":
            out = self._release(self._clause_end(final=True))
            self.unspoken = self.text[self.released :]
            self.released = len(self.text)
            return out
        return self._release(len(self.text))
