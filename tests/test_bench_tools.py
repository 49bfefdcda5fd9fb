"""``bench tools``: the request set is what the issue asks for and self-consistent; the pure scorer."""

from __future__ import annotations

import json

import jsonschema
import pytest

from omniduplex.benchmarks.tools import TurnResult, aggregate, args_match, load, normalise, score
from omniduplex.models.cascade.tool_prompt import tool_set


@pytest.fixture(scope="module")
def bench():
    return load()


def test_the_request_set(bench):
    tools, requests, date = bench
    tool_set(tools, "auto")  # every tool schema is a valid JSON Schema of an object
    schemas = {t["name"]: t["parameters"] for t in tools}
    needs = [r for r in requests if r.call]
    assert len(tools) >= 6 and len(needs) >= 24 and len(requests) - len(needs) >= 6
    assert {r.call["name"] for r in needs} == set(schemas)  # every tool is asked for
    for r in needs:  # the expected arguments satisfy the schema (any value "*" filled in)
        args = {k: ("x" if v == "*" else v) for k, v in r.call["arguments"].items()}
        jsonschema.validate(args, schemas[r.call["name"]])
        assert r.uses and isinstance(r.output, dict)
    # the date line names today and the days after, so "tomorrow" and "Sunday" have one right date
    assert date.startswith("Today is Friday, 2026-11-27. Tomorrow is Saturday, 2026-11-28; then Sunday")
    assert "24-hour clock" in date


def test_normalise_and_args_match():
    assert normalise(" Paris. ") == "paris" and normalise("New York") == normalise("new_york")
    assert normalise(5) == normalise(5.0) and normalise(True) is True
    assert args_match({"city": "Paris"}, {"city": "paris", "unit": "celsius"})  # open arguments not compared
    assert not args_match({"city": "Paris", "unit": "fahrenheit"}, {"city": "Paris"})
    assert args_match({"reason": "*"}, {"reason": "anything"}) and not args_match({"reason": "*"}, {})
    assert not args_match({"party_size": 4}, {"party_size": 5})


def _call(name: str, **args) -> dict:
    return {"call_id": "call_1", "name": name, "arguments": json.dumps(args)}


def test_score(bench):
    tools, requests, _ = bench
    schemas = {t["name"]: t["parameters"] for t in tools}
    order = next(r for r in requests if r.call and r.call["arguments"] == {"order_id": "48213"})
    hello = next(r for r in requests if r.text.startswith("Hello"))
    capital = next(r for r in requests if "capital" in r.text)
    good = TurnResult([_call("get_order_status", order_id="48213")], follow_up="It shipped with DHL.")
    want = {"right_tool": True, "right_args": True, "spurious": None, "valid": True, "cut": False}
    assert score(order, good, schemas) == {**want, "uses_result": True, "in_words_raw": True,
                                           "answer_right": None}
    echo = TurnResult([_call("get_order_status", order_id="48213")], follow_up='{"status": "shipped"}')
    assert score(order, echo, schemas)["uses_result"] is False  # JSON read out does not count
    # the model wrote JSON; the speakable-text stage said it in words: heard in words, the model's own not
    backstop = TurnResult([_call("get_order_status", order_id="48213")], follow_up="status shipped",
                          follow_up_raw='{"status": "shipped"}')
    scored = score(order, backstop, schemas)
    assert scored["uses_result"] and not scored["in_words_raw"]
    wrong = TurnResult([_call("get_order_status", order_id="48214")], follow_up="It shipped.")
    assert score(order, wrong, schemas)["right_args"] is False and score(order, wrong, schemas)["right_tool"]
    invalid = TurnResult([_call("get_order_status", order_id="x")])
    assert score(order, invalid, schemas)["valid"] is False
    missed = TurnResult(said="Your order is on its way.")
    assert score(order, missed, schemas)["right_tool"] is False
    spurious = score(hello, TurnResult([_call("get_weather", city="Paris")]), schemas)
    assert spurious["spurious"] is True and spurious["right_tool"] is None
    assert score(capital, TurnResult(said="It is Paris."), schemas)["answer_right"] is True
    agg = aggregate([score(order, good, schemas), score(order, missed, schemas), spurious])
    assert agg["n"] == 3 and agg["right_tool"] == 0.5 and agg["spurious"] == 1.0 and agg["valid"] == 1.0
