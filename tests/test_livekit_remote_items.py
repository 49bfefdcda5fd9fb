"""The remote plugin's copy of the server's conversation (app/surfaces/livekit/remote_items.py) on typed
events: server
items parsed from the wire update it, and the client events it builds are what the server parses."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import llm  # noqa: E402

from omniduplex.app.surfaces.livekit.remote_items import RemoteConversation  # noqa: E402
from omniduplex.app.surfaces.wire.realtime import server_events as S  # noqa: E402
from omniduplex.app.surfaces.wire.realtime.client_events import ConversationItemCreate, ConversationItemDelete  # noqa: E402
from omniduplex.app.surfaces.wire.realtime.protocol import (  # noqa: E402
    client_event_json,
    parse_client_event,
    parse_server_event,
)


def received(event) -> S.WireModel:
    """``event`` as the plugin receives it: serialized by the server, parsed by the link."""
    return parse_server_event(event.model_dump_json())


def test_server_items_update_the_copy_and_replay_as_client_events():
    conv = RemoteConversation()
    user = S.message_item("item_u", "user", [S.input_audio(None)])
    conv.on_item(received(S.conversation_item_added(user)).item)
    conv.on_item(
        received(S.conversation_item_done(S.message_item("item_s", "system", [S.input_text("x")]))).item
    )
    reply = S.message_item("item_a", "assistant", [S.output_audio("Hi there.")], "completed")
    conv.on_item(received(S.conversation_item_done(reply, "item_u")).item)
    conv.set_text("item_u", "hello")
    assert conv.items == [
        {"id": "item_u", "role": "user", "text": "hello"},
        {"id": "item_a", "role": "assistant", "text": "Hi there."},
    ]  # the system item is not part of the chat context
    replay = conv.replay()
    assert all(isinstance(e, ConversationItemCreate) for e in replay)
    parsed = [parse_client_event(client_event_json(e)) for e in replay]
    assert [(p.item.id, p.item.role, p.item.content[0].type, p.item.content[0].text) for p in parsed] == [
        ("item_u", "user", "input_text", "hello"),
        ("item_a", "assistant", "output_text", "Hi there."),
    ]


def test_update_chat_ctx_deletes_changed_and_missing_items_then_creates():
    conv = RemoteConversation()
    for it in (("a", "user", "one"), ("b", "assistant", "two"), ("c", "user", "three")):
        conv.on_item(S.message_item(it[0], it[1], [S.input_text(it[2])]))
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="user", content="one", id="a")
    ctx.add_message(role="assistant", content="two, changed", id="b")
    events = conv.update(ctx)
    wire = [json.loads(client_event_json(e)) for e in events]
    assert [type(e) for e in events] == [
        ConversationItemDelete,
        ConversationItemDelete,
        ConversationItemCreate,
    ]
    assert wire[0] == {"type": "conversation.item.delete", "item_id": "c"}
    assert wire[1]["item_id"] == "b" and wire[2]["item"]["content"] == [
        {"type": "output_text", "text": "two, changed"}
    ]
    assert [parse_client_event(json.dumps(w)).type for w in wire] == [w["type"] for w in wire]
