"""Cutting a streamed LLM reply into clauses for the TTS (pure policy, no model).

A VITS voice (Piper) speaks a whole utterance per call, so the cascade's TTS speaks the reply clause by
clause as the LLM writes it: the sooner the first clause is complete, the sooner the user hears audio.
:class:`ClauseSplitter` takes text deltas and returns the clauses that are now complete:

* cuts after sentence ends (``. ! ? …``) and clause boundaries (``, ; :`` followed by a space, ``—``,
  newlines); closing quotes/brackets/emphasis right after the mark stay with the clause;
* never inside numbers (``3.5``, ``1,000``, ``10:30``: the mark must be followed by whitespace), after
  common abbreviations (``e.g.``, ``Mr.``) or initials (``J.``, ``U.S.``), nor after a bare list number
  (``1.`` opening a line);
* the first clause is cut early, at the word boundary after ``first_max_words`` words, for time to first
  audio; later clauses shorter than ``min_words`` words are merged with the next (no tiny fragments), and
  a run with no boundary is cut after ``max_words`` words, and one "word" longer than
  :data:`MAX_RUN_CHARS` characters (``7,981,981,…``) is cut off;
* markdown symbols (``* # _ ` ~ |``), bullets and emoji are removed and whitespace is collapsed, so the
  TTS never speaks symbols; a piece with nothing left to say is dropped.

A cut is decided only once the character after it has arrived, so the clauses do not depend on how the
text was split into deltas; concatenated, they are the input without whitespace and the removed symbols.
"""

from __future__ import annotations

import re
import unicodedata

SENTENCE_END = ".!?…"
CLAUSE_MARKS = ",;:"
DASHES = "—"
CLOSERS = "\"')]}”’»*_`"
"""Characters that stay with the clause when they directly follow its final mark (``."``, ``:**``)."""
MARKDOWN = "*#_`~|•"
"""Markup the TTS must not read out; removed from every clause."""
_ABBREVIATIONS = (
    "e.g. i.e. etc. vs. mr. mrs. ms. dr. prof. sr. jr. st. mt. fig. approx. dept. est. inc. ltd. co. "
    "corp. jan. feb. mar. apr. jun. jul. aug. sep. sept. oct. nov. dec. a.m. p.m. cf. al."
)
ABBREVIATIONS = frozenset(_ABBREVIATIONS.split())
"""Lower-case words whose final ``.`` does not end a sentence."""
MAX_RUN_CHARS = 32
"""Longest run of non-whitespace characters held back waiting for a word boundary (:meth:`_run_cut`)."""
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+")
_LIST_NUMBER = re.compile(r"\d{1,3}\.")
_WORD = re.compile(r"\S*\w\S*")
_LONG_RUN = re.compile(rf"\S{{{MAX_RUN_CHARS + 1},}}")


def is_unspoken(ch: str) -> bool:
    """Whether ``ch`` is markup or an emoji (symbols U+2190 and up, variation selectors, ZWJ, skin tones)
    that the TTS should not read out."""
    if ch in MARKDOWN or ch in "\ufe0e\ufe0f\u200d":
        return True
    o = ord(ch)
    return (o >= 0x2190 and unicodedata.category(ch) == "So") or 0x1F3FB <= o <= 0x1F3FF


def clean(text: str) -> str:
    """``text`` without markup and emoji, whitespace runs collapsed to one space, stripped."""
    return " ".join("".join(c for c in text if not is_unspoken(c)).split())


def count_words(text: str) -> int:
    """Whitespace-separated tokens holding a letter or digit (``**`` and ``—`` are not words)."""
    return sum(1 for w in _WORD.findall(text) if any(c.isalnum() for c in w))


class ClauseSplitter:
    """Streamed reply text → speakable clauses (one per TTS call).

    Args:
        first_max_words: the first clause is cut at the first word boundary once it holds this many words.
        min_words: a later clause with fewer words waits and is merged with the next one.
        max_words: a run of text with no boundary is cut at a word boundary after this many words, so
            one unpunctuated ramble does not hold the voice back until the end of the reply.

    ``push(delta)`` returns the clauses completed by ``delta``; ``flush()`` (at the end of the reply)
    returns the rest. Each clause is cleaned (:func:`clean`) and non-empty.
    """

    def __init__(self, first_max_words: int = 6, min_words: int = 3, max_words: int = 40) -> None:
        self.first_max_words, self.min_words, self.max_words = first_max_words, min_words, max_words
        self.buf = ""  # text not yet emitted
        self.emitted = 0  # clauses emitted so far

    def push(self, text_delta: str) -> list[str]:
        """Add reply text; return the clauses it completed (possibly none)."""
        self.buf += text_delta
        out = []
        while (cut := self._next_cut()) is not None:
            piece, self.buf = self.buf[:cut], self.buf[cut:]
            if said := clean(piece):
                out.append(said)
                self.emitted += 1
        return out

    def flush(self) -> list[str]:
        """End of the reply: whatever is left, as one clause (or none if nothing speakable remains)."""
        piece, self.buf = self.buf, ""
        said = clean(piece)
        if said:
            self.emitted += 1
        return [said] if said else []

    def _next_cut(self) -> int | None:
        """End index (exclusive) of the next clause in ``buf``, or ``None`` while undecided."""
        first = self.emitted == 0
        need = 1 if first else self.min_words
        limit = self.first_max_words if first else self.max_words
        run = self._run_cut()
        for end in self._boundaries():
            if run is not None and end > run:
                break  # an endless "word" comes first
            words = count_words(self.buf[:end])
            if words > limit:
                break  # the word cut below comes first
            if words >= need:
                return end
            if words == 0 and not clean(self.buf[:end]):
                return end  # only markup or whitespace: drop it now
        word = self._word_cut(limit)
        return word if word is not None and (run is None or word <= run) else run

    def _run_cut(self) -> int | None:
        """A cut for the first run of more than :data:`MAX_RUN_CHARS` characters with no whitespace (a 135M
        model writing ``7,981,981,981,…``): before the run when words precede it, else after its first
        :data:`MAX_RUN_CHARS` characters; so the voice is never held back until the end of the reply by one
        endless "word". Decided once the run's next character has arrived, so the cut depends on the text
        only, not on how it arrived."""
        m = _LONG_RUN.search(self.buf)
        if m is None:
            return None
        start = m.start()
        return start if clean(self.buf[:start]) else start + MAX_RUN_CHARS

    def _word_cut(self, limit: int) -> int | None:
        """End of the ``limit``-th word, once the whitespace after it has arrived."""
        seen = 0
        for m in _WORD.finditer(self.buf):
            if any(c.isalnum() for c in m.group()):
                seen += 1
            if seen == limit:
                return m.end() if m.end() < len(self.buf) else None
        return None

    def _boundaries(self):
        """Confirmed cut positions in ``buf``, in order; stops at the first mark still awaiting its
        next character."""
        buf, i, n = self.buf, 0, len(self.buf)
        while i < n:
            c = buf[i]
            if c == "\n":
                yield i + 1
            elif c in DASHES:
                j = _after_closers(buf, i + 1)
                if j >= n:
                    return
                yield j
                i = j - 1
            elif c in SENTENCE_END or c in CLAUSE_MARKS:
                j = i + 1
                if c in SENTENCE_END:
                    while j < n and buf[j] in SENTENCE_END:
                        j += 1
                j = _after_closers(buf, j)
                if j >= n:
                    return  # the next character decides
                if buf[j].isspace() and not (c == "." and j == i + 1 and self._no_period_cut(i)):
                    yield j
                i = j - 1
            i += 1

    def _no_period_cut(self, i: int) -> bool:
        """A single ``.`` at ``buf[i]`` ending an abbreviation, initials, or a bare list number."""
        start = max(self.buf.rfind(" ", 0, i), self.buf.rfind("\n", 0, i), self.buf.rfind("\t", 0, i)) + 1
        token = self.buf[start : i + 1].lstrip("\"'([{“‘*_`")
        if token.lower() in ABBREVIATIONS or _INITIALS.fullmatch(token):
            return True
        line = self.buf[self.buf.rfind("\n", 0, i) + 1 : i + 1]
        return bool(_LIST_NUMBER.fullmatch(clean(line)))


def _after_closers(buf: str, j: int) -> int:
    while j < len(buf) and buf[j] in CLOSERS:
        j += 1
    return j


def clause_ends(text: str, final: bool = False) -> int:
    """End (exclusive) of the last complete clause or sentence of ``text``: the last position
    :class:`ClauseSplitter` confirms as a cut (a sentence end or clause mark followed by whitespace, a dash, a
    newline; never inside a number, after an abbreviation, initials or a bare list number), or 0 when there is
    none. ``final``: the text has ended, so a mark at its very end completes its clause ("Stir." is complete,
    "Stir" is not)."""
    splitter = ClauseSplitter()
    splitter.buf = text + " " if final else text
    ends = list(splitter._boundaries())
    return min(ends[-1], len(text)) if ends else 0
