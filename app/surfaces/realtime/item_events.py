"""The ``conversation.item.*`` client events of a Realtime connection: create, delete, truncate, retrieve.

``conversation.item.create`` → a typed message joins the session's history (a system message adds to the
instructions; a user message with audio is committed as a spoken turn), a ``function_call`` /
``function_call_output`` joins it as a tool entry (:func:`.tools.add_tool_item`); ``conversation.item.delete``
→ :meth:`Session.forget` / :meth:`Session.remove_entry`; ``conversation.item.truncate`` →
:meth:`Session.truncate` (the playing reply is stopped first); ``conversation.item.retrieve`` → the item as
the history holds it. Each answers with its server event, or raises :class:`ProtocolError` and changes
nothing. Source: OpenAI Realtime API reference (GA), client events ``conversation.item.*``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from omniduplex.app.core.audio import StreamResampler
from omniduplex.app.core.history import TOOL_ROLES
from omniduplex.app.core.session import Session
from omniduplex.app.core.vad import SAMPLE_RATE
from omniduplex.app.surfaces.realtime.items import ConversationItems, StoredItem
from omniduplex.app.surfaces.realtime.responses import ResponseLifecycle
from omniduplex.app.surfaces.realtime.tools import add_tool_item, tool_item
from omniduplex.app.surfaces.wire.realtime import server_events as ev
from omniduplex.app.surfaces.wire.realtime.audio import decode_payload
from omniduplex.app.surfaces.wire.realtime.client_events import (
    AssistantMessage,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    FunctionCall,
    FunctionCallOutput,
    SystemMessage,
    UserMessage,
)
from omniduplex.app.surfaces.wire.realtime.client_events import SessionConfig as RealtimeConfig
from omniduplex.app.surfaces.wire.realtime.protocol import ProtocolError


class ItemEvents:
    """The ``conversation.item.*`` handlers of :class:`~.connection.RealtimeConnection` (its base class),
    over the connection's state below."""

    session: Session
    items: ConversationItems
    responses: ResponseLifecycle
    cfg: RealtimeConfig
    speech_item: str | None  # the user item the open speech segment (or committed audio item) becomes
    _send: Callable[[ev.WireModel], None]
    _input_rate: int  # Hz of the client's input audio format

    def _item_create(self, e: ConversationItemCreate) -> None:
        item, item_id = e.item, e.item.id or ev.new_id("item")
        if item_id in self.items:
            raise ProtocolError("invalid_value", f"item {item_id} already exists", e.event_id, "item.id")
        if isinstance(item, (FunctionCall, FunctionCallOutput)):
            stored, done = add_tool_item(self.session, item, item_id, e.event_id)
            prev = self.items.append(item_id, stored)
            self._send(ev.conversation_item_added(done, prev))
            self._send(ev.conversation_item_done(done, prev))
            return
        if isinstance(item, SystemMessage):
            text = " ".join(c.text for c in item.content if getattr(c, "text", None))
            instructions = "\n".join(x for x in (self.session.cfg.instructions, text) if x)
            self.session.set_options(instructions=instructions)
        elif isinstance(item, AssistantMessage):
            texts = [c.text for c in item.content if getattr(c, "text", None)]  # else audio transcripts
            texts = texts or [c.transcript for c in item.content if getattr(c, "transcript", None)]
            text = " ".join(texts)
            entry = self.session.add_message("assistant", text)
            if entry is not None:
                self.items.put(item_id, StoredItem(None, "assistant", entry=entry))
        elif isinstance(item, UserMessage):
            audio = [c for c in item.content if c.type == "input_audio" and c.audio]
            if audio:
                fmt, rate = self.cfg.audio.input.format, self._input_rate
                wav = np.concatenate(
                    [StreamResampler(rate, SAMPLE_RATE).process(decode_payload(c.audio, fmt)) for c in audio]
                )
                turn_id = self._commit_audio_item(wav, item_id)
                self.items.put(item_id, StoredItem(turn_id, "user"))
                return  # its item events come with the commit
            text = " ".join(c.text for c in item.content if c.type == "input_text" and c.text)
            entry = self.session.add_user_text(text)
            if entry is not None:
                self.items.put(item_id, StoredItem(None, "user", entry=entry))
        prev = self.items.append(item_id)
        done = ev.client_item(item, item_id)
        self._send(ev.conversation_item_added(done, prev))
        self._send(ev.conversation_item_done(done, prev))

    def _commit_audio_item(self, wav: np.ndarray, item_id: str) -> str:
        self.speech_item = item_id
        return self.session.commit_audio(wav, respond=False)

    def _item_delete(self, e: ConversationItemDelete) -> None:
        item = self.items.pop(e.item_id)
        if item is None:
            raise ProtocolError("invalid_value", f"no item {e.item_id!r}", e.event_id, "item_id")
        if item.entry is not None:
            self.session.remove_entry(item.entry)
        else:
            self.session.forget(item.turn_id, item.role)
        self._send(ev.conversation_item_deleted(e.item_id))

    def _item_truncate(self, e: ConversationItemTruncate) -> None:
        item = self.items.get(e.item_id)
        if item is None or item.turn_id is None or item.role != "assistant":
            raise ProtocolError("invalid_value", f"no assistant item {e.item_id!r}", e.event_id, "item_id")
        playing = self.responses.of(item.turn_id)
        if playing is not None:
            playing.cancel_reason = "client_cancelled"  # truncating the playing reply stops it
        try:  # the session stops the reply if it still plays, then keeps what was played, in any order
            kept = self.session.truncate(item.turn_id, e.audio_end_ms)
        except ValueError as err:
            raise ProtocolError("invalid_value", str(err), e.event_id, "audio_end_ms") from err
        if kept is None:
            raise ProtocolError("invalid_value", f"item {e.item_id} has no audio to truncate", e.event_id)
        self._send(ev.conversation_item_truncated(e.item_id, e.content_index, e.audio_end_ms))

    def _item_retrieve(self, e: ConversationItemRetrieve) -> None:
        item = self.items.get(e.item_id)
        entry = None if item is None else item.entry or self.session.entry(item.turn_id, item.role)
        if entry is None:
            raise ProtocolError("invalid_value", f"no item {e.item_id!r}", e.event_id, "item_id")
        if entry.role in TOOL_ROLES:
            self._send(ev.conversation_item_retrieved(tool_item(e.item_id, entry)))
            return
        part = ev.input_text(entry.text) if entry.role == "user" else ev.output_audio(entry.text)
        self._send(ev.conversation_item_retrieved(ev.message_item(e.item_id, entry.role, [part])))

