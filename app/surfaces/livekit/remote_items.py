"""The remote session's copy of the server's conversation, and the Realtime API events that change it.

The server reports its items (``conversation.item.added|done|deleted``, input transcriptions); the framework
asks for the conversation (``chat_ctx``) and replaces it (``update_chat_ctx``). Only user and assistant text
crosses (the pipeline has no tools; instructions go through ``session.update``). A restarted server has
forgotten everything, so :meth:`RemoteConversation.replay` re-creates it item by item, with the same ids.
"""

from __future__ import annotations

from livekit.agents import llm

from omniduplex.app.surfaces.wire.realtime.client_events import ConversationItemCreate, ConversationItemDelete
from omniduplex.app.surfaces.wire.realtime.server_objects import Item


class RemoteConversation:
    """Items ``{"id", "role", "text"}`` in conversation order."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def get(self, item_id: str) -> dict | None:
        return next((it for it in self.items if it["id"] == item_id), None)

    def chat_ctx(self) -> llm.ChatContext:
        ctx = llm.ChatContext.empty()
        for it in self.items:
            ctx.add_message(role=it["role"], content=it["text"], id=it["id"])
        return ctx

    # -- what the server reports ------------------------------------------------------------------------
    def on_item(self, item: Item) -> None:
        """``conversation.item.added|done``: a user/assistant message joined or got its final text."""
        if item.role not in ("user", "assistant"):
            return
        text, found = item.text, self.get(item.id)
        if found is None:
            self.items.append({"id": item.id, "role": item.role, "text": text})
        elif text:
            found["text"] = text

    def on_deleted(self, item_id: str) -> None:
        self.items = [it for it in self.items if it["id"] != item_id]

    def set_text(self, item_id: str, text: str) -> None:
        """A transcription completed, or the room heard only part of a reply."""
        found = self.get(item_id)
        if found is not None:
            found["text"] = text

    # -- what to send -------------------------------------------------------------------------------------
    def replay(self) -> list[ConversationItemCreate]:
        """``conversation.item.create`` for every item with text, in order (a restarted server)."""
        return [create_event(it) for it in self.items if it["text"]]

    def update(self, chat_ctx: llm.ChatContext) -> list[ConversationItemCreate | ConversationItemDelete]:
        """Adopt ``chat_ctx``'s user/assistant text messages; returns the events that make the server's
        conversation the same: deletes for missing or changed items, creates for new or changed ones (the
        server appends a created item at the end)."""
        want = [
            {"id": m.id, "role": m.role, "text": (m.text_content or "").strip()}
            for m in chat_ctx.messages()
            if m.role in ("user", "assistant") and (m.text_content or "").strip()
        ]
        have, wanted = {it["id"]: it for it in self.items}, {it["id"] for it in want}
        events = [delete_event(it["id"]) for it in self.items if it["id"] not in wanted]
        for it in want:
            old = have.get(it["id"])
            if old is not None and old["text"] == it["text"]:
                continue
            if old is not None:
                events.append(delete_event(it["id"]))
            events.append(create_event(it))
        self.items = want
        return events


def create_event(it: dict) -> ConversationItemCreate:
    """``conversation.item.create`` of item ``it`` (``{"id", "role", "text"}``), with its id."""
    kind = "input_text" if it["role"] == "user" else "output_text"
    item = {
        "id": it["id"],
        "type": "message",
        "role": it["role"],
        "content": [{"type": kind, "text": it["text"]}],
    }
    return ConversationItemCreate(type="conversation.item.create", item=item)


def delete_event(item_id: str) -> ConversationItemDelete:
    return ConversationItemDelete(type="conversation.item.delete", item_id=item_id)
