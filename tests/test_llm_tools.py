"""The cascade LLM stage with tools, on the real SmolLM2-135M-Instruct weights and our engine: calls stream as
``tool_call_*`` meta with arguments that validate, the call loop is cut, a tool's output feeds the next reply,
bad tools fail the turn with the field named, and a reply cut by its budget ends at its last clause."""

from __future__ import annotations

import json

import jsonschema
import pytest
from tool_models import bench_tools, one_thread, smollm2_dir  # noqa: F401 (fixture)

from omniduplex.models.registry import load_model
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.llm import LLMWorker
from omniduplex.pipeline.stages.tool_calls import ARGUMENTS_DELTA, DONE, FAILED, REPEAT_ERROR, STARTED
from omniduplex.pipeline.text.clauses import clause_ends
from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")
SCHEMAS = {t["name"]: t["parameters"] for t in bench_tools()}
WEATHER = "What's the weather like in Paris right now?"


@pytest.fixture(scope="module")
def model():
    return load_model(smollm2_dir(), parts=("thinker",))


@pytest.fixture()
def worker(model):
    return LLMWorker(model, EngineSettings(num_blocks=256, max_num_seqs=4, max_num_batched_tokens=512))


def transcript(rid: str, transcript: str, **options) -> StageMessage:
    """The ASR stage's ``transcript`` of turn ``rid`` with the turn's ``options``."""
    return StageMessage(rid, {}, Transcript(transcript=transcript, turn=TurnOptions(**options)), last=True)


def run(worker: LLMWorker, rid: str, transcript_: str, **options) -> list[StageMessage]:
    worker.submit(transcript(rid, transcript_, **{"system_prompt": SPOKEN_SYSTEM_PROMPT, **options}))
    outs: list[StageMessage] = []
    for _ in range(600):
        if not worker.has_work():
            break
        outs += worker.step()
    assert not worker.has_work() and not worker.engine.has_unfinished() and len(worker.engine.grammars) == 0
    return outs


def events(outs, key):
    """The call events in field ``key`` of the LLM's messages (``call_started``, ``call_done``, ...)."""
    return [getattr(o.meta, key) for o in outs if getattr(o.meta, key) is not None]


def test_a_forced_call_streams_and_validates(worker):
    outs = run(
        worker,
        "t1",
        WEATHER,
        tools=bench_tools(),
        tool_choice="required",
        sampling={"max_tokens": 24},
    )
    assert [o.last for o in outs] == [False] * (len(outs) - 1) + [True]
    assert outs[-1].meta.finish_reason == "tool_calls"
    started, done, failed = events(outs, STARTED), events(outs, DONE), events(outs, FAILED)
    assert done and [s.call_id for s in started] == [c.call_id for c in sorted(
        done + failed, key=lambda c: [s.call_id for s in started].index(c.call_id))]
    assert all(f.error == REPEAT_ERROR for f in failed)  # one call per need: a repeat is refused
    for d in done:
        deltas = [e.delta for e in events(outs, ARGUMENTS_DELTA) if e.call_id == d.call_id]
        assert "".join(deltas) == d.arguments and len(deltas) > 1  # streamed while written
        jsonschema.validate(json.loads(d.arguments), SCHEMAS[d.name])
    assert "<tool_call>" not in "".join(o.meta.text or "" for o in outs)  # a call is not spoken
    assert outs[0].meta.turn.tools is None and outs[0].meta.turn.tool_choice is None


def test_the_call_loop_is_cut(model):
    worker = LLMWorker(model, EngineSettings(num_blocks=256, max_num_seqs=4), max_tool_calls=1)
    outs = run(worker, "t2", WEATHER, tools=bench_tools(), tool_choice="required")
    assert len(events(outs, DONE)) == 1 and outs[-1].meta.finish_reason == "tool_calls"
    # the turn's calls are spent: the next response of the same turn renders no tools and answers
    call = events(outs, DONE)[0]
    history = [
        ["user", WEATHER],
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 8}'},
    ]
    outs = run(
        worker,
        "t3",
        "",
        user_text="",
        history=history,
        tools=bench_tools(),
        tool_choice="required",
    )
    assert not events(outs, STARTED) and "".join(o.meta.text or "" for o in outs).strip()
    prompt = worker.tokenizer.decode(outs[0].tensors["prompt_ids"].tolist(), skip_special_tokens=False)
    assert "# Tools" not in prompt and '<tool_response>\ntemperature: 8\n</tool_response>' in prompt


def test_the_result_of_a_call_reaches_the_reply(worker):
    history = [
        ["user", WEATHER],
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"conditions": "light rain"}'},
    ]
    outs = run(
        worker, "t4", "", user_text="", history=history, tools=bench_tools(), tool_choice="none"
    )
    said = "".join(o.meta.text or "" for o in outs)
    assert "rain" in said.lower() and not events(outs, STARTED)
    assert outs[-1].meta.finish_reason in ("stop", "length")


def test_auto_lets_a_plain_answer_through(worker):
    outs = run(
        worker, "t5", "Hello, how are you today?", tools=bench_tools(), sampling={"max_tokens": 24}
    )
    said = "".join(o.meta.text or "" for o in outs)
    assert said.strip() and not events(outs, STARTED)


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ({"tools": [{"type": "function", "name": "x", "parameters": {"type": "object", "properties": 3}}]},
         r"turn t6: tools\[0\]\.parameters: not a valid JSON Schema"),
        ({"tools": bench_tools(), "tool_choice": {"type": "function", "name": "go"}}, "turn t6: tool_choice"),
        ({"history": [{"type": "function_call", "name": "x"}]}, r"history\[0\]\.call_id"),
        ({"sampling": {"grammar": "root ::= x"}}, "grammar is set by the stage"),
    ],
)  # fmt: skip
def test_bad_tool_input_fails_the_turn_naming_the_field(worker, meta, field):
    with pytest.raises(ValueError, match=field):
        worker.submit(transcript("t6", WEATHER, **meta))
    assert not worker.has_work()


def test_a_reply_out_of_tokens_finishes_its_sentence_or_ends_at_its_last_clause(worker):
    plain = "You are a helpful assistant."  # not the spoken prompt: SmolLM2 then writes a long list
    q = "How do I make a cup of green tea?"
    outs = run(worker, "t7", q, system_prompt=plain, sampling={"max_tokens": 40})
    said = "".join(o.meta.text or "" for o in outs)
    last = outs[-1].meta
    if last.finish_reason == "stop":  # the sentence said when the budget ran out was finished
        assert said.rstrip()[-1] in ".!?"
    else:  # the grace ran out too: cut at the last clause
        assert last.finish_reason == "length" and last.unspoken
        assert said and clause_ends(said, final=True) == len(said.rstrip())
    assert not any(line.lstrip()[:2] in ("1.", "- ", "**") for line in said.splitlines())


def test_prefill_hints_with_tools_are_a_prefix_of_the_turn(worker):
    meta = {
        "system_prompt": SPOKEN_SYSTEM_PROMPT,
        "tools": bench_tools(),
        "history": [["user", "Hi"], ["assistant", "Hello!"]],
    }
    hint = worker.chat.hint_ids("t8", TurnOptions(**meta), "What's the weather")
    full = worker.chat.prepare(transcript("t8", WEATHER, **meta)).ids
    assert len(hint) > 100 and full[: len(hint)] == hint
