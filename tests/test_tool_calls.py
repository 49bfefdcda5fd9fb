"""Call blocks parsed as they stream (any split of the text gives the same events), and the reply stream's
message meta: events before text, the text before a call released whole, call limits and the text budget."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given
from hypothesis import strategies as st

from omniduplex.models.cascade.tool_prompt import call_block
from omniduplex.pipeline.stages.tool_calls import (
    ARGUMENTS_DELTA,
    DONE,
    EVENT_KEYS,
    FAILED,
    STARTED,
    ToolCallParser,
)
from omniduplex.pipeline.text.reply_text import ReplyStream

REPLY = (
    "Let me check both.\n"
    + call_block("get_order_status", {"order_id": "48213"})
    + "\n"
    + call_block("get_weather", {"city": "São Paulo", "note": 'a "quoted" {brace}'})
    + "\nOne moment."
)


def _split(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]


def _parse(pieces: list[str]) -> list[tuple[str, object]]:
    parser = ToolCallParser()
    segments = [s for p in pieces for s in parser.push(p)] + parser.finish()
    assert not parser.in_block
    return segments


def _summary(segments):
    """Text joined, and the events with their ids replaced by call order."""
    text = "".join(v for k, v in segments if k == "text")
    ids: dict[str, int] = {}
    events = []
    for k, v in segments:
        if k == "text":
            continue
        v = dataclasses.asdict(v)  # a CallStarted / CallArgumentsDelta / CallDone / CallFailed
        v["call_id"] = ids.setdefault(v["call_id"], len(ids))
        events.append((k, v))
    return text, events


@given(st.lists(st.integers(0, len(REPLY)), max_size=30))
def test_any_split_gives_the_same_text_and_events(cuts):
    text, events = _summary(_parse(_split(REPLY, cuts)))
    assert text == "Let me check both.\n\n\nOne moment."
    starts = [e for k, e in events if k == STARTED]
    done = [e for k, e in events if k == DONE]
    assert [(s["name"], s["index"]) for s in starts] == [("get_order_status", 0), ("get_weather", 1)]
    assert [json.loads(d["arguments"]) for d in done] == [
        {"order_id": "48213"},
        {"city": "São Paulo", "note": 'a "quoted" {brace}'},
    ]
    for d in done:  # the deltas of a call, joined, are its arguments; all between its start and its end
        mine = [i for i, (k, e) in enumerate(events) if e["call_id"] == d["call_id"]]
        kinds = [events[i][0] for i in mine]
        assert kinds[0] == STARTED and kinds[-1] == DONE and set(kinds[1:-1]) == {ARGUMENTS_DELTA}
        assert "".join(events[i][1]["delta"] for i in mine[1:-1]) == d["arguments"]


BARE = 'Sure. {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}} One {moment}.'


@given(st.lists(st.integers(0, len(BARE)), max_size=12))
def test_bare_calls_any_split(cuts):
    """The call object without its tags (as Qwen2.5-Coder-0.5B writes it) is a call too."""
    text, events = _summary(_parse(_split(BARE, cuts)))
    assert text == "Sure.  One {moment}."
    assert [k for k, _ in events if k != ARGUMENTS_DELTA] == [STARTED, DONE]
    assert json.loads(events[-1][1]["arguments"]) == {"timezone": "Asia/Tokyo"}
    _, events = _summary(_parse(['{"name": "Bob", "age": 3} hi']))
    assert [k for k, _ in events] == [FAILED]  # an object in the call's shape that is no call: not spoken


FENCED = 'Ok.\n```json\n{\n"name": "get_time",\n"arguments": {\n"timezone": "Asia/Tokyo"\n}\n}\n```\nDone.'


@given(st.lists(st.integers(0, len(FENCED)), max_size=12))
def test_fenced_calls_any_split(cuts):
    """A call in a code fence (as Qwen2.5-Coder-1.5B writes it, its own whitespace included) is a call."""
    text, events = _summary(_parse(_split(FENCED, cuts)))
    assert text == "Ok.\n\nDone."
    assert [k for k, _ in events if k != ARGUMENTS_DELTA] == [STARTED, DONE]
    assert json.loads(events[-1][1]["arguments"]) == {"timezone": "Asia/Tokyo"}
    _, events = _summary(_parse(["```python\nprint(1)\n``` after"]))
    assert [k for k, _ in events] == [FAILED]  # code is never spoken


def test_call_ids_are_fresh():
    a = [v.call_id for k, v in _parse([REPLY]) if k == STARTED]
    b = [v.call_id for k, v in _parse([REPLY]) if k == STARTED]
    assert len(set(a + b)) == 4 and all(c.startswith("call_") and len(c) == 29 for c in a)


def test_loose_blocks_from_unconstrained_models():
    odd = '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>'
    _, events = _summary(_parse(["Sure. ", odd]))
    assert [k for k, _ in events] == [STARTED, ARGUMENTS_DELTA, DONE] and events[2][1][
        "name"
    ] == "get_weather"
    _, events = _summary(_parse(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par']))
    assert [k for k, _ in events] == [STARTED, ARGUMENTS_DELTA, FAILED]
    assert events[-1][1]["error"] == "the reply ended inside the call"
    _, events = _summary(_parse(["<tool_call>\nnot json\n</tool_call>"]))
    assert [k for k, _ in events] == [FAILED]
    text, events = _summary(_parse(["A <tool", "_call is not here, <tool"]))
    assert text == "A <tool_call is not here, <tool" and not events  # held, then released as text


def _meta_order_ok(meta: dict) -> bool:
    ranks = [EVENT_KEYS.index(k) for k in meta if k in EVENT_KEYS]
    return ranks == sorted(set(ranks))


@given(st.lists(st.integers(0, len(REPLY)), max_size=30))
def test_reply_stream_metas(cuts):
    stream = ReplyStream(speech=True, calls=True)
    metas = [m for p in _split(REPLY, cuts) for m in stream.push(p)]
    tail, reason = stream.finish("stop")
    metas += tail
    assert reason == "tool_calls" and stream.calls == 2
    assert all(_meta_order_ok(m) and isinstance(m["text"], str) for m in metas)
    said = "".join(m["text"] for m in metas)
    assert said == "Let me check both.\n\n\nOne moment."
    first_event = next(i for i, m in enumerate(metas) if STARTED in m)
    assert "".join(m["text"] for m in metas[:first_event]) == "Let me check both.\n"  # said before it


def test_call_limit_and_text_budget_end_the_reply():
    stream = ReplyStream(calls=True, max_calls=1)
    metas = stream.push(REPLY)
    assert stream.stop == "tool_calls" and stream.calls == 2  # the caller ends generation now
    assert stream.finish(None)[1] == "tool_calls"
    assert sum(DONE in m for m in metas) == 2
    stream = ReplyStream(calls=True, text_budget=3)
    for word in ("Hello", " there", "."):
        stream.push(word)
    assert stream.stop == "length"
    stream = ReplyStream(calls=True, text_budget=3)
    for piece in ("Ok.", "\n<tool_call>", '\n{"name": "a", "arguments": {"x": ', "1}}"):
        stream.push(piece)  # tokens inside a block do not count against the text budget
    assert stream.stop is None and stream.text_tokens == 1


def test_no_call_is_made_when_none_is_allowed():
    stream = ReplyStream(calls=True, max_calls=0)
    metas = stream.push(call_block("get_weather", {"city": "Paris"}))
    assert not any(DONE in m for m in metas)
    failed = [m[FAILED] for m in metas if FAILED in m]
    assert failed and "no tool call is allowed" in failed[0].error and not hasattr(failed[0], "arguments")


@given(st.lists(st.integers(0, len(REPLY)), max_size=30))
def test_the_filler_is_said_once_as_a_server_run_call_opens(cuts):
    """``filler`` goes out with the ``CallStarted`` of the first call of a ``filler_for`` function (its text,
    after the event; the event names it), not with a call of another function, and only once a reply."""
    filler = "One moment, let me check."
    stream = ReplyStream(speech=True, calls=True, filler=filler, filler_for=frozenset({"get_weather"}))
    metas = [m for p in _split(REPLY, cuts) for m in stream.push(p)]
    metas += stream.finish("stop")[0]
    assert all(_meta_order_ok(m) for m in metas)
    started = [m for m in metas if STARTED in m]
    assert [m[STARTED].name for m in started] == ["get_order_status", "get_weather"]
    assert started[0][STARTED].filler == "" and filler not in started[0]["text"]
    assert started[1][STARTED].filler == filler and started[1]["text"].startswith(filler)
    said = "".join(m["text"] for m in metas)
    assert said.count(filler) == 1 and said.index(filler) > said.index("Let me check both.")
    twice = ReplyStream(calls=True, filler=filler, filler_for=frozenset({"get_order_status", "get_weather"}))
    metas = twice.push(REPLY)
    assert [m[STARTED].filler for m in metas if STARTED in m] == [filler, ""]  # once per reply
    assert not any(m.get(STARTED) and m[STARTED].filler for m in ReplyStream(calls=True).push(REPLY))


def test_when_every_tool_runs_on_the_server_the_filler_goes_out_with_the_opener():
    """``filler_for=None``: the filler is said as soon as the call's opener is written (before its name
    streams), and the call's ``CallStarted`` names it; the text said before the call comes first."""
    filler = "One moment, let me check."
    stream = ReplyStream(speech=True, calls=True, filler=filler, filler_for=None)
    block = call_block("get_weather", {"city": "Paris"})
    cut = block.index("<tool_call>") + len("<tool_call>")
    opener, rest = block[:cut], block[cut:]
    metas = stream.push("Sure.") + stream.push(opener)
    assert not any(STARTED in m for m in metas) and "".join(m["text"] for m in metas).endswith(filler + " ")
    later = [m for p in rest for m in stream.push(p)] + stream.finish("stop")[0]
    (started,) = [m[STARTED] for m in later if STARTED in m]
    assert started.filler == filler and filler not in "".join(m["text"] for m in later)
    said = "".join(m["text"] for m in metas + later)
    assert said.index("Sure.") < said.index(filler) and said.count(filler) == 1
