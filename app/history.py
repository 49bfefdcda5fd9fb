"""Conversation history and the truncation rule for interrupted replies (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass, field


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


def truncate_aligned(chunks: list[tuple[int, str]], played: int) -> str:
    """The part of an interrupted reply the user heard, from the audio stage's text↔audio alignment.

    ``chunks``: ``(end, text)`` per reply audio chunk in order, ``end`` the cumulative sample count at the
    end of that chunk (any fixed rate, the same as ``played``); ``text`` the words the chunk speaks (the
    cascade's TTS emits one clause per chunk). ``played``: samples of reply audio sent to the client.
    Chunks played to their end are kept whole; the chunk playing when the reply stopped keeps the share
    of its characters in proportion to its played samples, cut back to the last whole word (none, if the
    first word was not finished). The estimate is confined to one clause instead of the whole reply.
    """
    kept, start = [], 0
    for end, text in chunks:
        text = text.strip()
        if played >= end:
            kept.append(text)
        elif played > start:
            n = round(len(text) * (played - start) / (end - start))
            cut = text[:n]
            if n < len(text) and not text[n].isspace():  # mid-word: back to the previous word's end
                cut = cut[: cut.rfind(" ") + 1] if " " in cut else ""
            kept.append(cut.strip())
            break
        else:
            break
        start = end
    return " ".join(k for k in kept if k)


@dataclass
class History:
    """``[role, text]`` turns carried across a session's turns (what the pipeline's ``history`` wants).

    ``max_entries`` bounds the prompt. Past it, the oldest entries are dropped down to half of it at once,
    not one per turn: between two trims every prompt starts with the same entries, so the LLM's prefix
    caching reuses the KV of the history on all but one turn in ``max_entries // 2``.
    """

    max_entries: int = 16
    entries: list[list[str]] = field(default_factory=list)

    def add(self, role: str, text: str) -> list[str] | None:
        """Append a turn and return its ``[role, text]`` entry (so a later transcript can replace its
        text in place); empty text is not recorded (``None``)."""
        if not text:
            return None
        entry = [role, text]
        self.entries.append(entry)
        if len(self.entries) > self.max_entries:
            del self.entries[: len(self.entries) - max(1, self.max_entries // 2)]
        return entry

    def remove(self, entry: list[str] | None) -> None:
        """Drop ``entry`` (an :meth:`add` result) if it is still held."""
        self.entries[:] = [e for e in self.entries if e is not entry]

    def snapshot(self) -> list[list[str]]:
        """A copy to hand to the pipeline (later turns do not mutate it)."""
        return [list(e) for e in self.entries]
