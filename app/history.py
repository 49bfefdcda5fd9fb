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


@dataclass
class History:
    """``[role, text]`` turns carried across a session's turns (what the pipeline's ``history`` wants).

    ``max_entries`` bounds the prompt: the oldest entries are dropped first.
    """

    max_entries: int = 16
    entries: list[list[str]] = field(default_factory=list)

    def add(self, role: str, text: str) -> None:
        """Append a turn; empty text is not recorded."""
        if not text:
            return
        self.entries.append([role, text])
        del self.entries[: max(0, len(self.entries) - self.max_entries)]

    def snapshot(self) -> list[list[str]]:
        """A copy to hand to the pipeline (later turns do not mutate it)."""
        return [list(e) for e in self.entries]
