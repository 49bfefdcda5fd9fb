"""Constrained decoding inside continuous batching: requests with and without grammars in the same steps,
arriving at different steps, preempted and aborted, decode the same ids as each alone; every constrained
output's calls parse and validate; every matcher is freed. A tiny random Qwen3 text model with its byte-level
tokenizer (random weights: the grammar alone makes its output calls)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import run
from tokenizers import Tokenizer
from tool_models import bench_tools, one_thread  # noqa: F401 (fixture)

from omniduplex.models.cascade.tool_prompt import tool_set
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.grammar import TokenizerGrammars
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.stages.tool_calls import DONE, FAILED, ToolCallParser

pytestmark = pytest.mark.usefixtures("one_thread")
SCHEMAS = {t["name"]: t["parameters"] for t in bench_tools()}
CHOICES = [None, "auto", "required", {"type": "function", "name": "get_weather"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("text"), "tiny", seed=3, text_only=True)
    thinker = load_model(d).thinker
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    stop = (tok.token_to_id("<|im_end|>"),)
    grammars = TokenizerGrammars(tok, thinker.cfg.vocab_size, stop)
    return (
        thinker,
        tok,
        stop,
        {str(c): c and grammars.compile_tools(tool_set(bench_tools(), c)) for c in CHOICES},
    )


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), num_blocks=st.sampled_from([40, 96]), budget=st.sampled_from([32, 256]))
def test_constrained_and_free_requests_batched_equal_each_alone(tiny, seed, num_blocks, budget):
    thinker, tok, stop, grammars = tiny
    rng = random.Random(seed)
    n = 8
    prompts = [[rng.randrange(0, 256) for _ in range(rng.randrange(2, 30))] for _ in range(n)]
    choices = [str(CHOICES[i % len(CHOICES)]) for i in range(n)]
    params = [
        SamplingParams(
            max_tokens=96,
            temperature=rng.choice([0.0, 0.7]),
            top_k=rng.choice([0, 40]),
            seed=100 + i,
            stop_token_ids=stop,
            grammar=grammars[choices[i]],
        )
        for i in range(n)
    ]
    alone = {}
    for i, p in enumerate(prompts):
        e = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=256)
        alone.update(run(e, {0: [Request(f"r{i}", p, params[i])]}))
        assert len(e.grammars) == 0  # freed when the request finished
    engine = Engine(
        DecoderLMAdapter(thinker), num_blocks=num_blocks, max_num_seqs=8, max_num_batched_tokens=budget
    )
    arrivals: dict[int, list[Request]] = {}
    for i, p in enumerate(prompts):
        arrivals.setdefault(rng.randrange(0, 6), []).append(Request(f"r{i}", p, params[i]))
    aborted = rng.randrange(n)
    got = run(engine, arrivals, {rng.randrange(1, 40): [f"r{aborted}"]})
    for i in range(n):
        rid = f"r{i}"
        if i == aborted:
            assert got[rid] == alone[rid][: len(got[rid])]
        else:
            assert got[rid] == alone[rid], (rid, choices[i])
    assert len(engine.grammars) == 0 and not engine.has_unfinished()
    assert engine.scheduler.allocator.num_free == num_blocks
    for i in range(n):  # outputs that ended: every call parses and validates, a forced call is made
        ids = alone[f"r{i}"]
        if choices[i] == "None" or ids[-1:] != list(stop):
            continue
        parser = ToolCallParser()
        events = parser.push(tok.decode(ids[:-1], skip_special_tokens=True)) + parser.finish()
        for kind, event in events:
            assert kind != FAILED, event
            if kind == DONE:
                jsonschema.validate(json.loads(event.arguments), SCHEMAS[event.name])
        assert parser.calls >= (choices[i] != "auto")


def test_a_refused_grammar_is_a_clear_error(tiny):
    thinker, tok, stop, grammars = tiny
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=16)
    bad = Request("r", [1, 2, 3], SamplingParams(grammar="get_weather"))
    with pytest.raises(ValueError, match="grammar must be a CompiledGrammar"):
        engine.add_request(bad)
    assert not engine.has_unfinished()
