"""Function tools in chat prompts: the tool set's checks, call items in the history, and each family's format
(Qwen2.5's own template; our inline format for templates without tools, which must render the same text)."""

from __future__ import annotations

import json
import time

import pytest
from tool_models import bench_tools, qwen05_dir, smollm2_dir

from omniduplex.models.cascade.chat_template import CHATML_TEMPLATE, ChatTemplate, load_chat_template
from omniduplex.models.cascade.tool_prompt import (
    calls_since_user,
    chat_messages,
    history_item,
    inline_tools,
    tool_set,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

HISTORY = [
    ["user", "Where is my order 48213, and what is the weather in Paris?"],
    ["assistant", "Let me check both."],
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_order_status",
        "arguments": '{"order_id": "48213"}',
    },
    {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": '{"status": "shipped"}'},
    {"type": "function_call_output", "call_id": "call_2", "output": "8 degrees and light rain"},
]


def test_tool_set_takes_realtime_and_chat_completions_shapes():
    nested = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    a, b = (
        tool_set([WEATHER], "auto"),
        tool_set([nested], {"type": "function", "function": {"name": "get_weather"}}),
    )
    assert a.tools == b.tools and a.choice == "auto" and b.choice == "get_weather"
    assert a.active and not a.forced and b.forced and a.key() != b.key()
    assert not tool_set([WEATHER], "none").active and tool_set([WEATHER], "none").callable == ()
    assert tool_set(None, None).tools == () and not tool_set(None, None).active
    assert tool_set([{"type": "function", "name": "hang_up"}]).tools[0].parameters["type"] == "object"


@pytest.mark.parametrize(
    ("tools", "choice", "field"),
    [
        ([{**WEATHER, "parameters": {"type": "object", "properties": {"city": {"type": "strin"}}}}], "auto",
         "tools[0].parameters: not a valid JSON Schema"),
        ([WEATHER, {**WEATHER, "name": "x", "parameters": {"type": "object", "required": "city"}}], "auto",
         "tools[1].parameters: not a valid JSON Schema"),
        ([{**WEATHER, "parameters": {"type": "string"}}], "auto", "tools[0].parameters: arguments must be"),
        ([{**WEATHER, "parameters": "city"}], "auto", "tools[0].parameters"),
        ([{**WEATHER, "name": "get weather"}], "auto", "tools[0].name"),
        ([WEATHER, WEATHER], "auto", "tools[1].name: 'get_weather' is defined twice"),
        ([{"type": "mcp", "server_url": "http://x"}], "auto", "tools[0].type"),
        ([WEATHER], {"type": "function", "name": "book"}, "tool_choice: no tool named 'book'"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([], "required", "tool_choice: required, but no tools"),
        ("get_weather", "auto", "tools: must be a list"),
    ],
)  # fmt: skip
def test_bad_tools_name_the_field(tools, choice, field):
    with pytest.raises(
        ValueError, match=r"^" + field.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
    ):
        tool_set(tools, choice)


def test_history_items_become_template_messages():
    items = [history_item(i, h, "history") for i, h in enumerate(HISTORY)]
    msgs = chat_messages(items)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
    calls = msgs[1]["tool_calls"]
    assert msgs[1]["content"] == "Let me check both." and [c["id"] for c in calls] == ["call_1", "call_2"]
    assert calls[0]["function"] == {"name": "get_order_status", "arguments": {"order_id": "48213"}}
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_2", "content": "8 degrees and light rain"}
    assert msgs[2]["content"] == "status: shipped"  # a JSON result as plain lines
    assert calls_since_user(items) == 2 and calls_since_user(items + [{"role": "user", "content": "x"}]) == 0
    # a call with no text before it opens its own assistant message
    alone = chat_messages([{"role": "user", "content": "hi"}, history_item(0, HISTORY[3], "h")])
    assert alone[1] == {"role": "assistant", "content": "", "tool_calls": [alone[1]["tool_calls"][0]]}


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"type": "function_call", "call_id": "c", "name": "x"}, r"history\[0\]\.arguments"),
        ({"type": "function_call_output", "call_id": "c", "output": {"a": 1}}, r"history\[0\]\.output"),
        (["system", "hi"], r"history\[0\] must be"),
        ({"type": "message"}, r"history\[0\] must be"),
    ],
)
def test_bad_history_items_name_the_field(item, field):
    with pytest.raises(ValueError, match=field):
        history_item(0, item, "history")


def _conversation():
    msgs = [{"role": "system", "content": "You are a voice agent."}]
    return msgs + chat_messages([history_item(i, h, "history") for i, h in enumerate(HISTORY)])


def test_inline_format_is_qwen25s_own_rendering():
    """Our format for templates without tools (ChatML here, as SmolLM2's) renders exactly what Qwen2.5's
    template renders for the same tools, calls and outputs."""
    qwen = load_chat_template(qwen05_dir())
    chatml = ChatTemplate(CHATML_TEMPLATE, {}, is_fallback=True)
    assert qwen.renders_tools and not chatml.renders_tools
    for choice in ("auto", "none"):
        tools = tool_set(bench_tools(), choice)
        assert chatml.render(_conversation(), tools=tools) == qwen.render(_conversation(), tools=tools)
    text = qwen.render(_conversation(), tools=tool_set(bench_tools()))
    for t in bench_tools():
        assert (
            json.dumps({"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}) in text
        )
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n8 degrees and light rain\n</tool_response><|im_end|>" in text
    # a JSON result is rendered as plain lines: nothing for a small model to read out as JSON
    assert "<tool_response>\nstatus: shipped\n</tool_response>" in text


def test_smollm2_template_gets_the_inline_format():
    smol = load_chat_template(smollm2_dir())
    assert not smol.renders_tools
    tools = tool_set(bench_tools())
    text = smol.render(_conversation(), tools=tools)
    plain = smol.render(inline_tools(_conversation(), tools))
    assert text == plain and text.startswith("<|im_start|>system\nYou are a voice agent.\n\n# Tools\n")
    assert "<tools>\n{" in text and "named SmolLM" not in text
    # no tools: the template's own rendering of a plain chat is unchanged
    chat = [{"role": "user", "content": "Hello"}]
    assert smol.render(chat, tools=None) == smol.render(chat)
    # a conversation with tools but no system message gets one holding the tools section
    text = smol.render(chat, tools=tools)
    assert text.startswith("<|im_start|>system\n# Tools\n") and "named SmolLM" not in text


def test_a_spoken_reply_that_may_not_call_is_decoded_without_json_tokens():
    """After a tool result a small model wrote the call again as JSON text: a spoken reply with no call
    allowed never samples a token holding a brace or backtick (the speakable stage would drop it anyway)."""
    from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
    from omniduplex.pipeline.stages.chat_prompt import ChatPrompter

    chat = ChatPrompter(smollm2_dir(), {})
    ids = set(chat.json_token_ids)
    vocab = chat.tokenizer.get_vocab()
    assert vocab["{"] in ids and vocab["`"] in ids and vocab["Paris"] not in ids
    opts = TurnOptions(tools=bench_tools(), tool_choice="none")

    def prepare(**update):
        turn = Transcript(transcript="Weather in Paris?", turn=opts.model_copy(update=update))
        return chat.prepare(StageMessage("t", {}, turn))

    spoken = prepare()
    assert ids <= set(spoken.sampling.suppress_token_ids) and spoken.reply["max_calls"] == 0
    written = prepare(spoken=False)  # chat completions: as written
    assert not ids & set(written.sampling.suppress_token_ids)
    auto = prepare(tool_choice="auto")  # calls need braces
    assert not ids & set(auto.sampling.suppress_token_ids)


def test_a_call_of_a_function_that_returned_a_result_is_refused_in_the_turn():
    """One call per need: after get_weather's result, a continuation that calls get_weather again, even with
    other arguments, is refused as a repeat (the 0.5B called the converter again with other numbers instead
    of saying the result); another function may be called, a failed call (``{"error": ...}``) retried, and a
    new user message starts afresh."""
    from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
    from omniduplex.pipeline.stages.chat_prompt import ChatPrompter
    from omniduplex.pipeline.stages.tool_calls import DONE, FAILED, REPEAT_ERROR
    from omniduplex.pipeline.text.reply_text import ReplyStream

    chat = ChatPrompter(smollm2_dir(), {})
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}

    def continuation(output: str, after: list | None = None):
        result = {"type": "function_call_output", "call_id": "c1", "output": output}
        history = [["user", "Weather in Paris?"], call, result] + (after or [])
        opts = TurnOptions(tools=bench_tools(), tool_choice="auto", history=history, user_text="")
        return chat.prepare(StageMessage("t", {}, Transcript(transcript="", turn=opts)))

    turn = continuation('{"city": "Paris", "conditions": "rain"}')
    assert turn.reply["answered"] == frozenset({"get_weather"})
    stream = ReplyStream(**turn.reply)
    other = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    metas = stream.push(other) + stream.finish("stop")[0]
    assert [m[FAILED].error for m in metas if FAILED in m] == [REPEAT_ERROR]
    assert not any(DONE in m for m in metas)
    stream = ReplyStream(**turn.reply)
    order = '<tool_call>\n{"name": "get_order_status", "arguments": {"order_id": "4217"}}\n</tool_call>'
    metas = stream.push(order) + stream.finish("stop")[0]
    assert [m[DONE].name for m in metas if DONE in m] == ["get_order_status"]
    assert continuation('{"error": "timeout"}').reply["answered"] == frozenset()  # a retry is allowed
    assert continuation("rain", [["user", "And in Lyon?"]]).reply["answered"] == frozenset()


def test_a_voice_turn_with_tools_gets_the_spoken_tools_prompt_and_todays_date():
    """The server's turn options (app/core/replies.py): the cascade's spoken default prompt becomes the
    tools prompt `bench tools` measures when the turn offers tools; a prompt the owner chose is kept."""
    import datetime
    from types import SimpleNamespace

    from omniduplex.app.core.replies import OrchestratorResponder
    from omniduplex.pipeline.messages import TurnOptions
    from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT, date_context

    tool = {"type": "function", "name": "get_order_status", "description": "Look up an order's status.",
            "parameters": {"type": "object", "properties": {}}}  # fmt: skip
    spoken = OrchestratorResponder(
        SimpleNamespace(output_rate=24000), TurnOptions(system_prompt=SPOKEN_SYSTEM_PROMPT)
    )
    with_tools = spoken._turn_options([], {"tools": [tool], "instructions": "Be brief."})
    assert "look up an order's status" in with_tools.system_prompt
    assert date_context(datetime.date.today()) in with_tools.system_prompt
    assert with_tools.system_prompt.endswith("\n\nBe brief.") and with_tools.tool_choice == "auto"
    assert spoken._turn_options([], {}).system_prompt == SPOKEN_SYSTEM_PROMPT  # no tools: the spoken one
    owner = OrchestratorResponder(
        SimpleNamespace(output_rate=24000), TurnOptions(system_prompt="You are Ada.")
    )
    assert owner._turn_options([], {"tools": [tool]}).system_prompt == "You are Ada."


def test_a_server_run_tool_gets_the_filler_as_its_call_opens():
    """The session offers its runner's filler with the runner's tools (not a client's); the server's turn
    options carry it; the LLM stage's reply says it with the call's ``CallStarted`` (spoken replies only),
    and the session then says no second filler while the call runs, nor in the reply's continuation."""
    from types import SimpleNamespace

    from omniduplex.app.core.history import History
    from omniduplex.app.core.replies import OrchestratorResponder
    from omniduplex.app.core.reply import Reply
    from omniduplex.app.core.session_config import SessionConfig
    from omniduplex.app.core.tool_turns import ToolCalls
    from omniduplex.pipeline.events import CallStarted
    from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
    from omniduplex.pipeline.stages.chat_prompt import ChatPrompter
    from omniduplex.pipeline.stages.tool_calls import STARTED
    from omniduplex.pipeline.text.reply_text import ReplyStream

    orders, _, weather = bench_tools()[:3]  # the runner's order lookup; the client's own weather tool
    runner = SimpleNamespace(tools=[orders], filler_text="One moment.", filler_after_s=0.8)
    calls = ToolCalls("s", History(), lambda e: None, SessionConfig(tools=[weather]), runner, time.monotonic)
    offered = calls.offer()
    assert offered["call_filler"] == "One moment." and offered["call_filler_tools"] == ["get_order_status"]
    runner.filler_after_s = 0  # the filler switched off: none offered
    assert "call_filler" not in calls.offer()

    responder = OrchestratorResponder(SimpleNamespace(output_rate=24000), TurnOptions())
    opts = responder._turn_options([], offered)
    assert opts.call_filler == "One moment." and opts.call_filler_tools == ["get_order_status"]
    chat = ChatPrompter(smollm2_dir(), {})

    def prepare(**update):
        turn = Transcript(transcript="Where is order 4217?", turn=opts.model_copy(update=update))
        return chat.prepare(StageMessage("t", {}, turn))

    spoken = prepare()
    assert spoken.reply["filler"] == "One moment." and spoken.reply["filler_for"] == {"get_order_status"}
    assert "filler" not in prepare(spoken=False).reply  # chat completions: no filler
    assert "filler" not in prepare(tool_choice="none").reply  # no call possible
    block = '<tool_call>\n{"name": "get_order_status", "arguments": {"order_id": "4217"}}\n</tool_call>'
    metas = ReplyStream(**spoken.reply).push(block)
    started = next(m for m in metas if STARTED in m)
    assert started[STARTED].filler == "One moment." and started["text"].strip() == "One moment."

    r = Reply("t1", 0.0, 0.0, options=offered)
    calls.on_event(r, CallStarted("c1", "get_order_status", filler="One moment."))
    assert r.filled
    sent = []
    starter = SimpleNamespace(start=lambda rid, wave, history, options: sent.append(options), events=len)
    calls.continue_reply(r, starter)
    assert sent and "call_filler" not in sent[0] and sent[0]["tools"] == offered["tools"]
