"""The speakable-text stage: what an LLM writes → what a voice can say, on a stream of text deltas.

Everything a reply says passes here on its way to the TTS and the history (:class:`~.spoken.SpokenReply`
runs it, for every LLM backend). Two streaming steps, each holding back only what the next characters could
still change:

* :class:`BlockFilter` (before markdown is stripped): code fences (three backticks ... three backticks) are
  dropped; a JSON object (``{`` to its matching ``}``) is said as words ("status shipped, arrives Friday"),
  or dropped when it does not parse; a markdown table row (a line starting with ``|``) is said as its cells
  joined by commas, the ``|---|`` separator row dropped; a rule line (``---``, ``***``, ``===``) is dropped.
  It holds a table row until its line ends and a JSON object until it closes (at most
  :data:`MAX_JSON_CHARS` characters: a longer one is dropped, not held);
* :class:`Verbalizer` (after markdown is stripped): complete words go through
  :func:`~.verbalize.verbalize` (numbers, dates, times, currencies, units, URLs, symbols, emoji → words);
  it holds the word being written, and the complete words before it that hold a digit or are a month name
  (a unit, day or year may follow: "5 km", "November 27, 2026"), at most :data:`MAX_HELD_CHARS` characters.

:func:`is_speakable` is the contract the TTS can rely on, tested on adversarial model output
(``tests/test_speakable.py``).
"""

from __future__ import annotations

import json
import re

from omniduplex.pipeline.text.json_scan import JsonValueEnd
from omniduplex.pipeline.text.verbalize import MONTHS, SPEECH_PUNCTUATION, verbalize

MAX_JSON_CHARS = 2000
"""A JSON object longer than this is dropped as it streams rather than held to its end."""
MAX_HELD_CHARS = 64
"""A run of text without whitespace longer than this is verbalized as it stands (never held longer)."""
FENCE = "```"
_RULE = re.compile(r"[ \t]*([-=*_])(?:[ \t]*\1){2,}[ \t]*")
_SPACES = re.compile(r"[ \t]{2,}")
_MAYBE_RULE = re.compile(r"(?:[-=*_][ \t]*)*")
_TABLE_SEPARATOR = re.compile(r":?-+:?")
_MONTH_WORDS = frozenset(m.lower() for m in MONTHS) | frozenset(m[:3].lower() for m in MONTHS)


def is_speakable(text: str) -> bool:
    """Whether ``text`` holds only what a voice says: letters, combining marks, whitespace and
    :data:`~.verbalize.SPEECH_PUNCTUATION`, no digit, a hyphen only between two letters (never a list dash),
    and no URL.

    >>> is_speakable("Your order shipped and arrives Friday."), is_speakable('{"status": "shipped"}')
    (True, False)
    """
    import unicodedata

    for i, c in enumerate(text):
        if c.isdigit():
            return False
        if c.isalpha() or c.isspace() or unicodedata.category(c).startswith("M"):
            continue
        if c not in SPEECH_PUNCTUATION:
            return False
        if c == "-" and not (0 < i < len(text) - 1 and text[i - 1].isalpha() and text[i + 1].isalpha()):
            return False
    return "://" not in text and "www." not in text.lower()


def json_words(block: str) -> str:
    """A JSON value said as words: an object's members as "key value" phrases joined by commas (keys'
    underscores as spaces, nested values the same way), a list's items joined by commas, ``true``/``false``
    as yes/no; ``""`` when ``block`` does not parse.

    >>> json_words('{"status": "shipped", "arrives": "Friday", "gift_wrap": false}')
    'status shipped, arrives Friday, gift wrap no'
    """
    try:
        value = json.loads(block)
    except ValueError:
        return ""
    return _said(value)


def _said(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {_said(v)}".strip() for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_said(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    return str(value)


def table_row_words(row: str) -> str:
    """A markdown table row (``| a | b |``) as its cells joined by commas, ended by a period; ``""`` for the
    separator row (``|---|:--:|``) or a row of empty cells."""
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if all(not c or _TABLE_SEPARATOR.fullmatch(c) for c in cells):
        return ""
    return ", ".join(c for c in cells if c) + ".\n"


class BlockFilter:
    """Code fences, JSON objects, table rows and rule lines of a stream of deltas (module docstring):
    ``push`` returns what can be decided, ``push(.., final=True)`` / ``flush`` the rest."""

    def __init__(self) -> None:
        self.buf = ""
        self.mode = "text"  # text | fence | json | row
        self.line_start = True
        self.block: list[str] = []  # the JSON object so far (``None`` once over MAX_JSON_CHARS)
        self.block_len = 0
        self.json = JsonValueEnd()

    def push(self, delta: str, final: bool = False) -> str:
        self.buf += delta
        buf, out, i, n = self.buf, [], 0, len(self.buf)
        while i < n:
            if self.mode == "fence":
                j = buf.find(FENCE, i)
                if j < 0:
                    i = n if final else max(i, n - len(FENCE) + 1)  # a closing fence may be starting
                    break
                i, self.mode = j + len(FENCE), "text"
                out.append(" ")
                continue
            if self.mode == "json":
                i = self._scan_json(buf, i, out)
                continue
            if self.mode == "row":
                j = buf.find("\n", i)
                if j < 0 and not final:
                    break
                end = n if j < 0 else j + 1
                out.append(table_row_words(buf[i:end]))
                i, self.mode, self.line_start = end, "text", True
                continue
            if self.line_start:
                k = i
                while k < n and buf[k] in " \t":
                    k += 1
                if k < n and buf[k] == "|":
                    self.mode, i = "row", k
                    continue
                j = buf.find("\n", k)
                line = buf[k : n if j < 0 else j]
                if _RULE.fullmatch(line) and (j >= 0 or final):
                    i = n if j < 0 else j + 1
                    continue
                if not final and (k == n or (j < 0 and _MAYBE_RULE.fullmatch(line) and len(line) < 8)):
                    break  # still a possible rule or table row
                self.line_start = False
            c = buf[i]
            if c == "`" and buf.startswith(FENCE, i):
                self.mode, i = "fence", i + len(FENCE)
                continue
            if c == "`" and not final and FENCE.startswith(buf[i:]):
                break  # a fence may be starting
            if c == "{":
                self.mode, self.block, self.block_len = "json", [], 0
                self.json = JsonValueEnd()
                continue
            out.append(c)
            self.line_start = c == "\n"
            i += 1
        self.buf = buf[i:]
        if final:
            self.buf, self.mode = "", "text"  # an unclosed fence or object is dropped
        return "".join(out)

    def _scan_json(self, buf: str, i: int, out: list[str]) -> int:
        """Scan the JSON object from ``buf[i]``; at its end, its words join ``out``. Returns where it
        stopped (the end of ``buf`` while the object is open)."""
        start, ended = i, False
        while i < len(buf) and not ended:
            ended = self.json.step(buf[i])
            i += 1
        self.block_len += i - start
        if self.block is not None:
            self.block.append(buf[start:i])
            if self.block_len > MAX_JSON_CHARS:
                self.block = None  # too long to hold: dropped
        if ended:
            said = json_words("".join(self.block)) if self.block is not None else ""
            out.append(f" {said} " if said else " ")
            self.mode = "text"
        return i

    def flush(self) -> str:
        return self.push("", final=True)


class Verbalizer:
    """:func:`~.verbalize.verbalize` over a stream of deltas, holding back only the word being written and
    a complete word that its next word could change (module docstring)."""

    def __init__(self) -> None:
        self.buf = ""
        self.cue = ""  # the last word said, when it may mark a year ("in", "since", ...)
        self.space = True  # the output so far ends with whitespace (or is empty)

    def push(self, delta: str, final: bool = False) -> str:
        self.buf += delta
        cut = len(self.buf) if final else self._cut()
        if cut == 0:
            return ""
        chunk, self.buf = self.buf[:cut], self.buf[cut:]
        cue = self.cue
        said = verbalize(f"{cue} {chunk}") if cue else ""
        said = said[len(cue) + 1 :] if said.startswith(cue + " ") else verbalize(chunk)
        words = chunk.split()
        last = words[-1].strip(".,;:!?\"'").lower() if words else ""
        self.cue = last if last.isalpha() and len(last) <= 6 else ""
        said = _SPACES.sub(" ", said)
        if self.space:
            said = said.lstrip(" \t")
        if final:
            said = said.rstrip(" \t")
        if said:
            self.space = said[-1].isspace()
        return said

    def _cut(self) -> int:
        """Where the text that can be said now ends (after whitespace, before a held word)."""
        buf = self.buf
        end = max(buf.rfind(" "), buf.rfind("\n"), buf.rfind("\t")) + 1
        if end == 0:
            return len(buf) if len(buf) > MAX_HELD_CHARS else 0
        held = end
        while held > 0:  # hold the trailing words a next word could change: "November 27, 2026", "5 km"
            prev = buf[:held].rstrip()
            start = max(prev.rfind(" "), prev.rfind("\n"), prev.rfind("\t")) + 1
            word = prev[start:]
            if not word or not (any(c.isdigit() for c in word) or word.strip(".,").lower() in _MONTH_WORDS):
                break
            if len(buf) - start > MAX_HELD_CHARS:
                break
            held = start
        return held

    def flush(self) -> str:
        return self.push("", final=True)
