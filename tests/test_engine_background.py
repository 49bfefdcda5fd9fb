"""Background requests (the LLM stage's prefill hints): planned after the other requests of a step, at most
``BACKGROUND_TOKENS`` rows a step, with the same outputs as when run alone."""

from __future__ import annotations

import random

import pytest

from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.scheduler import BACKGROUND_BESIDE, BACKGROUND_TOKENS
from tests.test_engine import run, sequential_greedy


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("text"), "tiny", seed=3, text_only=True)
    return load_model(d).thinker


def test_background_prefill_is_chunked_and_a_turn_goes_first(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=256)
    hint = Request("hint", list(range(3, 3 + 70)), SamplingParams(max_tokens=1), background=True)
    engine.add_request(hint)
    engine.step()
    assert hint.num_computed == BACKGROUND_TOKENS  # not the 70 rows the budget would allow
    turn = Request("turn", [7] * 40, SamplingParams(max_tokens=4))
    engine.add_request(turn)
    plan = engine.scheduler.schedule()
    # the turn is planned first and whole; the hint only takes a few rows beside it
    assert [(r.request_id, n) for r, n in plan.items] == [("turn", 40), ("hint", BACKGROUND_BESIDE)]


def test_background_rows_per_step_are_capped_over_all_background_requests(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=256)
    for i in range(4):
        engine.add_request(Request(f"h{i}", [i + 1] * 20, SamplingParams(max_tokens=1), background=True))
    sched, plans = engine.scheduler, []
    real = sched.schedule
    sched.schedule = lambda: plans.append(real()) or plans[-1]  # the real plan, recorded
    while engine.has_unfinished():
        engine.step()
    assert sum(p.num_tokens for p in plans) == 4 * 20
    assert all(0 < p.num_tokens <= BACKGROUND_TOKENS for p in plans)


def test_a_decode_step_carries_no_background_rows(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=256)
    turn = Request("turn", [7] * 10, SamplingParams(max_tokens=8))
    engine.add_request(turn)
    engine.step()  # prefilled: it decodes from now on
    hint = Request("hint", list(range(3, 63)), SamplingParams(max_tokens=1), background=True)
    engine.add_request(hint)
    sched, plans = engine.scheduler, []
    real = sched.schedule

    def recording():  # the real plan, recorded
        plan = real()
        plans.append([(r.request_id, n) for r, n in plan.items])
        return plan

    sched.schedule = recording
    while engine.has_unfinished():
        engine.step()
    assert plans[:7] == [[("turn", 1)]] * 7  # the decodes alone, on their one-row path
    assert plans[7:] == [[("hint", BACKGROUND_TOKENS)]] * 3 + [[("hint", 60 - 3 * BACKGROUND_TOKENS)]]
    assert len(turn.output_ids) == 8 and hint.num_prefill_computed == 60


def test_a_turn_prefill_carries_a_few_background_rows(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=256)
    engine.add_request(Request("hint", list(range(3, 63)), SamplingParams(max_tokens=1), background=True))
    engine.add_request(Request("turn", [7] * 10, SamplingParams(max_tokens=8)))
    plan = engine.scheduler.schedule()
    assert [(r.request_id, n) for r, n in plan.items] == [("turn", 10), ("hint", BACKGROUND_BESIDE)]


def test_a_turn_reuses_the_rows_its_hint_computed(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=256)
    heard = [5, 9, 11] * 12  # 36 rows of "the words heard so far"
    hint = Request("t#prefill", heard, SamplingParams(max_tokens=1), background=True)
    engine.add_request(hint)
    engine.step()
    engine.step()  # 32 rows computed: two full KV blocks
    engine.abort("t#prefill")  # the turn's message drops its hint, as the LLM stage does
    prompt = heard + [17, 19, 23]
    turn = Request("t", prompt, SamplingParams(max_tokens=6))
    got = run(engine, {0: [turn]})
    assert turn.num_cached_tokens >= 2 * BACKGROUND_TOKENS
    assert got["t"] == sequential_greedy(thinker, prompt, 6)


def test_mixed_background_and_turns_equal_each_alone(thinker):
    rng = random.Random(7)
    prompts = [[rng.randrange(0, 256) for _ in range(rng.randrange(1, 60))] for _ in range(12)]
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=96, max_num_seqs=12, max_num_batched_tokens=48)
    arrivals: dict[int, list[Request]] = {}
    for i, p in enumerate(prompts):
        req = Request(f"r{i}", p, SamplingParams(max_tokens=5), background=i % 3 == 0)
        arrivals.setdefault(rng.randrange(0, 6), []).append(req)
    got = run(engine, arrivals)
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == sequential_greedy(thinker, p, 5), i
    assert engine.scheduler.allocator.num_free == 96
