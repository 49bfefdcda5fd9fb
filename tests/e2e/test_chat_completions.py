"""``POST /v1/chat/completions`` on the default cascade (the real SmolLM2 LLM stage, in-process stages),
driven by the official ``openai`` SDK: a plain answer, streaming with usage, a tool call whose arguments
satisfy the tool's schema (forced with a named ``tool_choice``: the 135M model is not relied on to choose a
tool by itself), the answer after the tool's output, and malformed bodies → 400."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import LocalServer

pytestmark = pytest.mark.slow

ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "order_status",
        "description": "Look up the delivery status of an order by its id.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "The order id, like A100."}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def server():
    srv = LocalServer(create_app(ServerConfig(processes=False, max_tokens=32)))
    with srv:
        yield srv


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", timeout=300)


def test_plain_and_streamed(client):
    ask = [{"role": "user", "content": "How many days are in a week?"}]
    r = client.chat.completions.create(model="omniduplex", messages=ask, max_completion_tokens=24)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    stream = client.chat.completions.create(
        model="omniduplex", messages=ask, max_completion_tokens=24, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text.strip() and reasons in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    # greedy decoding on the same prompt: the stream says what the plain response said
    assert text == choice.message.content


def test_tool_call_then_answer(client):
    msgs = [{"role": "user", "content": "Where is my order A100?"}]
    named = {"type": "function", "function": {"name": "order_status"}}
    for stream in (False, True):
        r = client.chat.completions.create(
            model="omniduplex", messages=msgs, tools=[ORDER_TOOL], tool_choice=named, stream=stream
        )
        if stream:
            chunks = list(r)
            deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
            call_id, name = deltas[0].id, deltas[0].function.name
            arguments = "".join(d.function.arguments or "" for d in deltas)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert reason == ["tool_calls"]
        else:
            assert r.choices[0].finish_reason == "tool_calls"
            (call,) = r.choices[0].message.tool_calls
            call_id, name, arguments = call.id, call.function.name, call.function.arguments
        assert name == "order_status" and call_id.startswith("call_")
        jsonschema.validate(json.loads(arguments), ORDER_TOOL["function"]["parameters"])

    follow = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ]},
        {"role": "tool", "tool_call_id": call_id, "content": "Order A100 shipped Monday, arrives Thursday."},
    ]
    r = client.chat.completions.create(
        model="omniduplex", messages=follow, tools=[ORDER_TOOL], max_completion_tokens=32
    )
    answer = r.choices[0].message
    assert answer.content and answer.content.strip() and not answer.tool_calls
    assert r.usage.prompt_tokens > 40  # the tool's output is in the prompt


@pytest.mark.parametrize(
    "body, param",
    [
        ("{not json", None),
        ("[]", None),
        (json.dumps({"model": "x"}), "messages"),
        (json.dumps({"messages": []}), "messages"),
        (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}), "messages"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 2}), "n"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}), "max_tokens"),
        (json.dumps({"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "4"}]}), "messages"),
        (
            json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "banana"}}}
            ]}),
            "tools",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
        ),
    ],
)
def test_malformed_bodies_are_400(server, body, param):
    r = httpx.post(server.url("/v1/chat/completions"), content=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert err["param"] == param, err
