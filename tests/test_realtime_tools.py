"""Function tools on the Realtime API (GA): tools and tool_choice reach each reply (session-level, overridden
per response), a response's calls are ``function_call`` items with streamed arguments, every server event
parses with the ``openai`` SDK's models, the client's ``function_call_output`` joins the history the next
reply is started with, and bad input is refused with an ``error`` naming the field. The responder here is
scripted (the session ↔ pipeline seam); tests/e2e/test_realtime_tools_e2e.py runs the real cascade."""

from __future__ import annotations

import json

import numpy as np
from fastapi.testclient import TestClient
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyTextDelta
from omniduplex.app.core.tools import CallArgumentsDelta, CallDone, CallStarted
from omniduplex.app.server import ServerConfig, create_app

SERVER = TypeAdapter(RealtimeServerEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}


def call(cid: str, name: str, args: dict, index: int) -> list:
    text = json.dumps(args)
    deltas = [CallArgumentsDelta(cid, text[:5]), CallArgumentsDelta(cid, text[5:])]
    return [CallStarted(cid, name, index), *deltas, CallDone(cid, name, text)]


class ToolResponder:
    """Records each turn's history and options; the first reply makes two calls, later ones speak."""

    output_rate = 24000

    def __init__(self) -> None:
        self.starts: list[tuple[list, dict]] = []

    def start(self, turn_id, waveform, history, options=None):
        self.starts.append((list(history), dict(options or {})))

    async def events(self, turn_id):
        if len(self.starts) == 1:
            for ev in call("call_a", "get_weather", {"city": "Paris"}, 0) + call(
                "call_b", "get_time", {"zone": "Europe/Paris"}, 1
            ):
                yield ev
        else:
            yield ReplyTextDelta("It is sunny in Paris.")
            yield ReplyAudioChunk(np.full(4800, 0.1, np.float32), "It is sunny in Paris.")
        yield ReplyDone()

    def cancel(self, turn_id):
        pass


def until(ws, kind: str) -> list:
    """Server events up to the first of ``kind``, each parsed by the SDK's models."""
    out = []
    while True:
        e = SERVER.validate_python(ws.receive_json())
        out.append(e)
        if e.type in (kind, "error"):
            return out


def send(ws, kind: str, **fields) -> None:
    ws.send_json({"type": kind, **fields})


def user_text(ws, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    send(ws, "conversation.item.create", item=item)
    until(ws, "conversation.item.done")


def test_calls_are_function_call_items_and_their_outputs_reach_the_next_reply():
    resp = ToolResponder()
    with TestClient(create_app(ServerConfig(max_sessions=2), responder=resp)) as c, c.websocket_connect(
        "/v1/realtime"
    ) as ws:
        until(ws, "session.created")
        session = {"type": "realtime", "tools": [WEATHER, TIME], "tool_choice": "auto"}
        send(ws, "session.update", session=session)
        assert until(ws, "session.updated")[-1].session.tools[0].name == "get_weather"
        user_text(ws, "Weather and time in Paris?")
        send(ws, "response.create", response={"tool_choice": "required"})
        events = until(ws, "response.done")
        types = [e.type for e in events]
        assert types == [
            "response.created",
            *(["response.output_item.added", "conversation.item.added"]
              + ["response.function_call_arguments.delta"] * 2
              + ["response.function_call_arguments.done", "response.output_item.done"]
              + ["conversation.item.done"])
            * 2,
            "response.done",
        ]
        done = events[-1].response
        assert done.status == "completed" and [o.type for o in done.output] == ["function_call"] * 2
        assert [(o.call_id, o.name, json.loads(o.arguments)) for o in done.output] == [
            ("call_a", "get_weather", {"city": "Paris"}),
            ("call_b", "get_time", {"zone": "Europe/Paris"}),
        ]
        args = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [(a.output_index, a.item_id) for a in args] == [(0, done.output[0].id), (1, done.output[1].id)]
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta"
                         and e.call_id == "call_a")
        assert deltas == args[0].arguments
        assert not any(e.type.startswith("response.output_audio") for e in events)  # a call is not spoken
        # the session's tools with the response's choice went to the pipeline
        assert resp.starts[0][1]["tool_choice"] == "required" and len(resp.starts[0][1]["tools"]) == 2
        # outputs: JSON and not JSON (kept as text)
        for cid, output in (("call_a", '{"conditions": "sunny"}'), ("call_b", "ten past three")):
            item = {"type": "function_call_output", "call_id": cid, "output": output}
            send(ws, "conversation.item.create", item=item)
            added = until(ws, "conversation.item.done")[-1].item
            assert (added.type, added.call_id, added.output) == ("function_call_output", cid, output)
        send(ws, "response.create", response={"tool_choice": "none"})
        events = until(ws, "response.done")
        assert [o.type for o in events[-1].response.output] == ["message"]
        history, options = resp.starts[1]
        assert history == [
            ["user", "Weather and time in Paris?"],
            {"type": "function_call", "call_id": "call_a", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_b", "name": "get_time",
             "arguments": '{"zone": "Europe/Paris"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": '{"conditions": "sunny"}'},
            {"type": "function_call_output", "call_id": "call_b", "output": "ten past three"},
        ]
        assert options["user_text"] == "" and options["tool_choice"] == "none"
        # a tool item is retrieved and deleted like a message
        call_item = done.output[0].id
        send(ws, "conversation.item.retrieve", item_id=call_item)
        got = until(ws, "conversation.item.retrieved")[-1].item
        assert (got.type, got.call_id, got.name) == ("function_call", "call_a", "get_weather")
        send(ws, "conversation.item.delete", item_id=call_item)
        assert until(ws, "conversation.item.deleted")[-1].item_id == call_item
        send(ws, "conversation.item.truncate", item_id=done.output[1].id, content_index=0, audio_end_ms=0)
        assert until(ws, "error")[-1].error.param == "item_id"  # a call has no audio
        send(ws, "response.create")
        until(ws, "response.done")
        assert all(h.get("call_id") != "call_a" or h["type"] != "function_call"
                   for h in resp.starts[2][0] if isinstance(h, dict))


def test_bad_tools_and_unknown_call_ids_are_refused_naming_the_field():
    resp = ToolResponder()
    with TestClient(create_app(ServerConfig(max_sessions=2), responder=resp)) as c, c.websocket_connect(
        "/v1/realtime"
    ) as ws:
        until(ws, "session.created")
        bad = {**TIME, "parameters": {"type": "object", "properties": {"zone": {"type": 5}}}}
        send(ws, "session.update", event_id="u1", session={"type": "realtime", "tools": [WEATHER, bad]})
        err = until(ws, "error")[-1]
        assert err.error.param == "session.tools[1].parameters" and err.error.event_id == "u1"
        assert "not a valid JSON Schema" in err.error.message
        send(ws, "session.update", session={"type": "realtime", "tools": [WEATHER],
                                            "tool_choice": {"type": "function", "name": "nope"}})
        assert until(ws, "error")[-1].error.param == "session.tool_choice"
        send(ws, "response.create", response={"tools": [{"type": "function", "name": "x y"}]})
        assert until(ws, "error")[-1].error.param == "response.tools[0].name"
        item = {"type": "function_call_output", "call_id": "call_unknown", "output": "{}"}
        send(ws, "conversation.item.create", event_id="c1", item=item)
        err = until(ws, "error")[-1]
        assert err.error.param == "item.call_id" and "call_unknown" in err.error.message
        # nothing was applied: the session still has no tools, and a reply gets none
        send(ws, "response.create")
        until(ws, "response.done")
        assert "tools" not in resp.starts[-1][1]
