"""The framework's chat context ↔ a session's history (in-process plugin).

LiveKit keeps its own ``llm.ChatContext`` (items with ids) and reads the model's view of the conversation
through ``RealtimeSession.chat_ctx``; it writes changes back with ``update_chat_ctx(ctx)``, meaning "make
your conversation this". Our :class:`~omniduplex.app.core.history.History` holds immutable entries, each
with a ``key`` that stays when its text is replaced (a transcript arrives, a reply is truncated), so
item ids are kept beside it, keyed by entry key (:class:`ItemIds`). User and assistant text messages and
function calls and their outputs (``llm.FunctionCall`` / ``llm.FunctionCallOutput`` ↔ the history's tool
entries) cross; instructions travel through ``update_instructions``.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from livekit.agents import llm

from omniduplex.app.core.history import FUNCTION_CALL, FUNCTION_CALL_OUTPUT, Entry, History

ROLES = ("user", "assistant")


class ItemIds:
    """Chat item id of each history entry (an entry gets a fresh ``item_…`` id the first time it is seen)."""

    def __init__(self) -> None:
        self._by_key: dict[int, str] = {}  # entry key → item id

    def name(self, entry: Entry | None, item_id: str) -> None:
        """Give ``entry`` the id ``item_id`` (the id the framework already knows it by)."""
        if entry is not None:
            self._by_key[entry.key] = item_id

    def of(self, entry: Entry) -> str:
        """``entry``'s item id (a new one the first time)."""
        return self._by_key.setdefault(entry.key, f"item_{secrets.token_hex(8)}")

    def prune(self, entries: tuple[Entry, ...]) -> None:
        """Forget entries no longer in the history."""
        keep = {e.key for e in entries}
        for k in [k for k in self._by_key if k not in keep]:
            del self._by_key[k]


def history_chat_ctx(history: History, ids: ItemIds) -> llm.ChatContext:
    """The history as the framework's chat context (one message per entry, in order)."""
    ctx = llm.ChatContext.empty()
    names = {e.call_id: e.name for e in history.entries if e.role == FUNCTION_CALL}
    for entry in history.entries:
        iid, cid = ids.of(entry), entry.call_id
        if entry.role == FUNCTION_CALL:
            ctx.items.append(llm.FunctionCall(id=iid, call_id=cid, name=entry.name, arguments=entry.text))
        elif entry.role == FUNCTION_CALL_OUTPUT:
            name = names.get(cid, "")
            ctx.items.append(
                llm.FunctionCallOutput(id=iid, call_id=cid, name=name, output=entry.text, is_error=False)
            )
        else:
            ctx.add_message(role=entry.role, content=entry.text, id=iid)
    return ctx


def _tool_entry(history: History, ids: ItemIds, item, current: dict[str, Entry]) -> Entry:
    """The history entry of a function call or output item (the one held under its id, or a new one)."""
    if item.type == FUNCTION_CALL:
        role, text, name = FUNCTION_CALL, item.arguments, item.name
    else:
        role, text, name = FUNCTION_CALL_OUTPUT, item.output, ""
    entry = current.get(item.id)
    if entry is None or (entry.role, entry.call_id, entry.text) != (role, item.call_id, text):
        entry = history.new(role, text, item.call_id, name)
        ids.name(entry, item.id)
    return entry


def apply_chat_ctx(history: History, ids: ItemIds, chat_ctx: llm.ChatContext) -> None:
    """Make ``history`` hold ``chat_ctx``'s user/assistant text messages, in its order.

    Entries whose id is in ``chat_ctx`` are kept (under the same key, so the session's references to them
    stay valid) with the context's text; new ids become new entries; entries whose id is missing are
    dropped. Function calls and outputs become tool entries. Empty messages, other roles and other items are
    skipped. The newest ``max_entries`` stay.
    """
    current = {ids.of(e): e for e in history.entries}
    entries: list[Entry] = []
    for item in chat_ctx.items:
        if item.type in (FUNCTION_CALL, FUNCTION_CALL_OUTPUT):
            entries.append(_tool_entry(history, ids, item, current))
            continue
        if item.type != "message" or item.role not in ROLES:
            continue
        text = (item.text_content or "").strip()
        if not text:
            continue
        entry = current.get(item.id)
        if entry is None or entry.role != item.role:
            entry = history.new(item.role, text)
            ids.name(entry, item.id)
        elif entry.text != text:
            entry = replace(entry, text=text)
        entries.append(entry)
    history.replace_all(entries)
    ids.prune(history.entries)
