"""Conversation history (immutable entries) and the truncation rules for interrupted replies (pure functions).

Every truncation returns a prefix of the reply's generated text, character for character (whitespace
included), so the history, the transcript a client saw and the text a later turn is prompted with agree.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from omniduplex.pipeline.text.clauses import is_unspoken


def truncate_reply(text: str, played_ms: float, generated_ms: float) -> str:
    """The part of an interrupted reply's ``text`` the user actually heard.

    Word timing is unknown, so characters are taken in proportion to audio time: keep the first
    ``round(len(text) × played_ms / generated_ms)`` characters, where ``text`` and ``generated_ms``
    are what the pipeline had produced when the reply stopped and ``played_ms`` is the reply audio
    sent to the client. A cut inside a word is moved back to the end of the previous word (a
    reply that is one long word keeps the raw prefix). Nothing played → ``""``; all played → all.
    The Thinker's text runs ahead of the Talker's audio, so this errs towards keeping slightly
    more than was heard.
    """
    if played_ms <= 0 or not text:
        return ""
    if generated_ms <= 0 or played_ms >= generated_ms:
        return text
    n = round(len(text) * played_ms / generated_ms)
    if n >= len(text):
        return text
    if n <= 0:
        return ""
    cut = text[:n]
    if not text[n].isspace() and not cut[-1].isspace():
        space = cut.rstrip().rfind(" ")
        if space > 0:
            cut = cut[:space]
    return cut.rstrip()


def truncate_aligned(chunks: list[tuple[int, str]], played: int, text: str) -> str | None:
    """The part of an interrupted reply the user heard, from the audio stage's text↔audio alignment.

    ``chunks``: ``(end, said)`` per reply audio chunk in order, ``end`` the cumulative sample count at the
    end of that chunk (any fixed rate, the same as ``played``); ``said`` the words the chunk speaks (the
    cascade's TTS emits one clause per chunk, :func:`~omniduplex.pipeline.text.clauses.clean`-ed: whitespace
    collapsed, markup dropped). ``played``: samples of reply audio sent to the client. ``text``: the reply as
    generated (its text deltas joined).

    Chunks played to their end are kept whole; the chunk playing when the reply stopped keeps the share of
    its characters in proportion to its played samples, cut back to the last whole word (none, if the first
    word was not finished). The words kept are then located in ``text`` (:func:`spoken_prefix`), so the
    result is a prefix of ``text``. ``None`` when the chunks' words are not ``text``'s (the caller then
    falls back to :func:`truncate_reply`).
    """
    kept, start = [], 0
    for end, said in chunks:
        said = said.strip()
        if played >= end:
            kept.append(said)
        elif played > start:
            n = round(len(said) * (played - start) / (end - start))
            cut = said[:n]
            if n < len(said) and not said[n].isspace():  # mid-word: back to the previous word's end
                cut = cut[: cut.rfind(" ") + 1] if " " in cut else ""
            kept.append(cut.strip())
            break
        else:
            break
        start = end
    return spoken_prefix(text, " ".join(k for k in kept if k))


def spoken_prefix(text: str, spoken: str) -> str | None:
    """The shortest prefix of ``text`` that holds the characters of ``spoken`` in order.

    ``spoken`` is ``text`` as a TTS front end said it (whitespace collapsed, markup and emoji dropped:
    :func:`~omniduplex.pipeline.text.clauses.clean`), so between two of its characters ``text`` may only hold
    whitespace and such unspoken characters. ``None`` when ``spoken`` does not match ``text`` that way.
    Example: ``spoken_prefix("Hi!\n\n**Yes** sir", "Hi! Yes")`` is ``"Hi!\n\n**Yes"``.
    """
    i = 0
    for c in spoken:
        if c.isspace():
            continue
        while i < len(text) and text[i] != c:
            if not (text[i].isspace() or is_unspoken(text[i])):
                return None
            i += 1
        if i == len(text):
            return None
        i += 1
    return text[:i]


FUNCTION_CALL = "function_call"
FUNCTION_CALL_OUTPUT = "function_call_output"
TOOL_ROLES = (FUNCTION_CALL, FUNCTION_CALL_OUTPUT)
"""The ``role`` of a tool entry (:mod:`omniduplex.app.core.tools`): a call the model made (``text``: its
arguments, a JSON object as a string) or a call's result (``text``: the output, JSON or plain text)."""


@dataclass(frozen=True)
class Entry:
    """One turn of the history: ``role`` (``user`` / ``assistant``, or a tool entry: :data:`TOOL_ROLES`) and
    its ``text``; a tool entry also has its ``call_id`` and (a call) the function's ``name``. Immutable: a new
    text (a transcript, a truncation) makes a new entry with the same ``key``, which names the turn for as
    long as the history holds it. Unpacks as ``(role, text)``."""

    role: str
    text: str
    key: int
    call_id: str = ""
    name: str = ""

    def __iter__(self) -> Iterator[str]:
        return iter((self.role, self.text))

    def wire(self) -> list[str] | dict[str, Any]:
        """The entry as the pipeline's ``history`` holds it: ``[role, text]``, or for a tool entry the OpenAI
        item (``{"type": "function_call", "call_id", "name", "arguments"}`` /
        ``{"type": "function_call_output", "call_id", "output"}``)."""
        if self.role == FUNCTION_CALL:
            return {"type": FUNCTION_CALL, "call_id": self.call_id, "name": self.name, "arguments": self.text}
        if self.role == FUNCTION_CALL_OUTPUT:
            return {"type": FUNCTION_CALL_OUTPUT, "call_id": self.call_id, "output": self.text}
        return [self.role, self.text]


class History:
    """The turns carried across a session's turns, oldest first (what the pipeline's ``history`` wants).

    ``max_entries`` bounds the prompt. Past it, the oldest entries are dropped down to half of it at once,
    not one per turn: between two trims every prompt starts with the same entries, so the LLM's prefix
    caching reuses the KV of the history on all but one turn in ``max_entries // 2``.
    """

    def __init__(self, max_entries: int = 16) -> None:
        self.max_entries = max_entries
        self._entries: list[Entry] = []
        self._keys = itertools.count(1)

    @property
    def entries(self) -> tuple[Entry, ...]:
        """The entries held now, oldest first."""
        return tuple(self._entries)

    def new(self, role: str, text: str, call_id: str = "", name: str = "") -> Entry:
        """An entry with a fresh key, not yet held (for :meth:`replace_all`); ``call_id`` / ``name``: a tool
        entry's."""
        return Entry(role, text, next(self._keys), call_id, name)

    def add(self, role: str, text: str) -> Entry | None:
        """Append a turn and return its entry; empty text is not recorded (``None``)."""
        if not text:
            return None
        entry = self.new(role, text)
        self._entries.append(entry)
        if len(self._entries) > self.max_entries:
            del self._entries[: len(self._entries) - max(1, self.max_entries // 2)]
        return entry

    def add_tool(self, role: str, text: str, call_id: str, name: str = "") -> Entry:
        """Append a tool entry (``role`` one of :data:`TOOL_ROLES`; recorded even with empty ``text``)."""
        if role not in TOOL_ROLES:
            raise ValueError(f"a tool entry's role is one of {TOOL_ROLES}, got {role!r}")
        entry = Entry(role, text, next(self._keys), call_id, name)
        self._entries.append(entry)
        if len(self._entries) > self.max_entries:
            del self._entries[: len(self._entries) - max(1, self.max_entries // 2)]
        return entry

    def call(self, call_id: str) -> Entry | None:
        """The ``function_call`` entry of ``call_id`` still held (``None``: unknown)."""
        return next((e for e in self._entries if e.role == FUNCTION_CALL and e.call_id == call_id), None)

    def get(self, key: int | None) -> Entry | None:
        """The entry held under ``key`` (``None`` if it was removed or trimmed away)."""
        return next((e for e in self._entries if e.key == key), None) if key is not None else None

    def set_text(self, key: int | None, text: str) -> Entry | None:
        """Replace the text of the entry under ``key`` (same key, same place); empty ``text`` removes it.
        Returns the new entry, ``None`` when it was removed or is not held."""
        for i, e in enumerate(self._entries):
            if e.key == key:
                if not text:
                    del self._entries[i]
                    return None
                self._entries[i] = replace(e, text=text)
                return self._entries[i]
        return None

    def remove(self, entry: Entry | int | None) -> bool:
        """Drop an entry (or the one under a key) if it is still held; ``False`` when it is not."""
        key = entry.key if isinstance(entry, Entry) else entry
        n = len(self._entries)
        self._entries = [e for e in self._entries if e.key != key]
        return len(self._entries) < n

    def replace_all(self, entries: Iterable[Entry]) -> None:
        """Hold exactly ``entries`` (the newest ``max_entries`` of them), e.g. a client's edited context."""
        self._entries = list(entries)[-self.max_entries :] if self.max_entries else []

    def snapshot(self) -> list[Any]:
        """The entries to hand to the pipeline (:meth:`Entry.wire`: ``[role, text]`` pairs and tool items;
        later turns do not change them)."""
        return [e.wire() for e in self._entries]
