"""``backend: openai`` against our own ``POST /v1/chat/completions``: ``omniduplex serve`` (the default
cascade) run as a user runs it (a child process, scrubbed environment: tests/served.py) is the brain of an
LLM stage here. The reply streams, and a forced tool call's streamed deltas become our ``tool_call_*``
events with arguments that satisfy the tool's schema (grammar-constrained on the serving side)."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from omniduplex.pipeline.config import StageConfig
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.stages.openai_llm import OpenAILLMWorker
from omniduplex.pipeline.stages.tool_calls import DONE, STARTED

pytestmark = pytest.mark.slow
ORDER = {
    "type": "function",
    "name": "order_status",
    "description": "Look up the delivery status of an order by its id.",
    "parameters": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
        "additionalProperties": False,
    },
}


@pytest.fixture()
def ours(default_server):
    return default_server.url("/v1")


def drain(worker, deadline_s: float = 300):
    outs, errors, end = [], [], time.monotonic() + deadline_s
    while worker.has_work() and time.monotonic() < end:
        outs += worker.step()
        errors += worker.pop_errors()
    return outs, errors


def test_backend_openai_on_our_chat_completions(ours):
    worker = OpenAILLMWorker(StageConfig(backend="openai", base_url=ours, model="omniduplex", timeout_s=300))
    try:
        ask = Transcript(transcript="How many days are in a week?", turn=TurnOptions(voice="joe"))
        worker.submit(StageMessage("1", {}, ask, last=True))
        outs, errors = drain(worker)
        assert not errors and outs[-1].last and outs[0].meta.turn.voice == "joe"
        assert "".join(o.meta.text or "" for o in outs).strip()
        assert outs[-1].meta.finish_reason in ("stop", "length")

        opts = TurnOptions(tools=[ORDER], tool_choice="required")
        order = Transcript(transcript="Where is my order A100?", turn=opts)
        worker.submit(StageMessage("2", {}, order, last=True))
        outs, errors = drain(worker)
        assert not errors and outs[-1].meta.finish_reason == "tool_calls"
        (start,) = [getattr(o.meta, STARTED) for o in outs if getattr(o.meta, STARTED) is not None]
        (done,) = [getattr(o.meta, DONE) for o in outs if getattr(o.meta, DONE) is not None]
        assert start.name == done.name == "order_status"
        jsonschema.validate(json.loads(done.arguments), ORDER["parameters"])
    finally:
        worker.close()
