"""``POST /v1/chat/completions`` on ``omniduplex serve`` run as a user runs it (a child process, no
``OMNIDUPLEX_*`` variable: tests/served.py), driven by the official ``openai`` SDK: a plain answer, streaming
with usage, a forced tool call (``tool_choice: "required"`` and a named function, on the default model: the
call is grammar-constrained) whose arguments satisfy the tool's schema, the answer after the tool's output,
and malformed bodies → 400. No request leaves a traceback in the server's log. (An ``auto`` call chosen by the
model: tests/e2e/test_tools_chosen_by_the_model.py.)"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

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


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What's the weather like in Lisbon right now?"}]


@pytest.fixture()
def server(default_server):
    return default_server


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", timeout=300, max_retries=0)


def no_traceback(server) -> None:
    log = server.log()
    assert "Traceback" not in log, log[-4000:]


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
    # (not compared word for word with the plain answer: a server with its default thread governor may
    # step with another thread count, and float rounding then may pick another greedy token)


def test_forced_tool_call_then_answer(server, client):
    msgs = [{"role": "user", "content": "Where is my order A100?"}]
    named = {"type": "function", "function": {"name": "order_status"}}
    for stream, choice in ((False, named), (True, named), (False, "required"), (True, "required")):
        r = client.chat.completions.create(
            model="omniduplex", messages=msgs, tools=[ORDER_TOOL], tool_choice=choice, stream=stream
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
            call = r.choices[0].message.tool_calls[0]  # ("required" lets the model make more than one)
            call_id, name, arguments = call.id, call.function.name, call.function.arguments
        assert name == "order_status" and call_id.startswith("call_")
        jsonschema.validate(json.loads(arguments), ORDER_TOOL["function"]["parameters"])

    follow = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ]},
        {"role": "tool", "tool_call_id": call_id, "content": "Order A100 shipped Monday, arrives Thursday."},
    ]
    r = client.chat.completions.create(  # tool_choice none, as a session continues after a forced call
        model="omniduplex", messages=follow, tools=[ORDER_TOOL], tool_choice="none", max_completion_tokens=32
    )
    answer = r.choices[0].message
    assert answer.content and answer.content.strip() and not answer.tool_calls
    assert r.usage.prompt_tokens > 40  # the tool's output is in the prompt
    no_traceback(server)


def test_the_issue_question_forced_on_the_default_model(server, client):
    """issue 39's reproduction: ``get_weather`` forced, as a new user first tried it."""
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(
            model="omniduplex", messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice=choice
        )
        assert r.choices[0].finish_reason == "tool_calls", r
        for call in r.choices[0].message.tool_calls:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    no_traceback(server)


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
