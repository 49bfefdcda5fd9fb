"""The framework's chat context ↔ a session's history (in-process plugin).

LiveKit keeps its own ``llm.ChatContext`` (items with ids) and reads the model's view of the conversation
through ``RealtimeSession.chat_ctx``; it writes changes back with ``update_chat_ctx(ctx)``, meaning "make
your conversation this". Our :class:`~omniduplex.app.history.History` holds ``[role, text]`` entries
(mutable lists: the session edits them in place when a transcript arrives or a reply is truncated), so
item ids are kept beside it, keyed by entry identity (:class:`ItemIds`). Only user and assistant text
messages cross: instructions travel through ``update_instructions``, and the pipeline has no tool calls.
"""

from __future__ import annotations

import secrets

from livekit.agents import llm

from omniduplex.app.history import History

ROLES = ("user", "assistant")


class ItemIds:
    """Chat item id of each history entry (an entry gets a fresh ``item_…`` id the first time it is seen)."""

    def __init__(self) -> None:
        self._by_entry: dict[int, tuple[list[str], str]] = {}  # id(entry) → (entry, item id); keeps it alive

    def name(self, entry: list[str] | None, item_id: str) -> None:
        """Give ``entry`` the id ``item_id`` (the id the framework already knows it by)."""
        if entry is not None:
            self._by_entry[id(entry)] = (entry, item_id)

    def of(self, entry: list[str]) -> str:
        held = self._by_entry.get(id(entry))
        if held is None or held[0] is not entry:
            held = self._by_entry[id(entry)] = (entry, f"item_{secrets.token_hex(8)}")
        return held[1]

    def prune(self, entries: list[list[str]]) -> None:
        """Forget entries no longer in the history."""
        keep = {id(e) for e in entries}
        for k in [k for k in self._by_entry if k not in keep]:
            del self._by_entry[k]


def history_chat_ctx(history: History, ids: ItemIds) -> llm.ChatContext:
    """The history as the framework's chat context (one message per entry, in order)."""
    ctx = llm.ChatContext.empty()
    for entry in history.entries:
        ctx.add_message(role=entry[0], content=entry[1], id=ids.of(entry))
    return ctx


def apply_chat_ctx(history: History, ids: ItemIds, chat_ctx: llm.ChatContext) -> None:
    """Make ``history`` hold ``chat_ctx``'s user/assistant text messages, in its order.

    Entries whose id is in ``chat_ctx`` are kept (the same list objects, so the session's references to them
    stay valid) with the context's text; new ids become new entries; entries whose id is missing are
    dropped. Empty messages, other roles and non-message items are skipped. The newest ``max_entries`` stay.
    """
    current = {ids.of(e): e for e in history.entries}
    entries: list[list[str]] = []
    for item in chat_ctx.items:
        if item.type != "message" or item.role not in ROLES:
            continue
        text = (item.text_content or "").strip()
        if not text:
            continue
        entry = current.get(item.id)
        if entry is None or entry[0] != item.role:
            entry = [item.role, text]
            ids.name(entry, item.id)
        else:
            entry[1] = text
        entries.append(entry)
    history.entries[:] = entries[-history.max_entries :]
    ids.prune(history.entries)
