"""Engine correctness: a request's output is the same alone, batched, preempted or beside aborts,
and equal to the sequential reference (fp32 greedy and seeded sampling)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.block_manager import BlockAllocator, NoFreeBlocks
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.request import Request, SamplingParams


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("text"), "tiny", seed=3, text_only=True)
    return load_model(d).thinker


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(0, 256) for _ in range(rng.randrange(1, 40))] for _ in range(n)]


@torch.no_grad()
def sequential_greedy(thinker, prompt: list[int], max_tokens: int) -> list[int]:
    """One request, contiguous cache, argmax: the models issue's reference decoding loop."""
    cfg = thinker.cfg
    kv = allocate_kv_cache(cfg.num_hidden_layers, 8, cfg.num_key_value_heads, cfg.head_dim)
    hidden, _ = thinker(thinker.embed(torch.tensor(prompt)), ForwardBatch.contiguous([len(prompt)], [0]), kv)
    out = [int(thinker.compute_logits(hidden[-1:]).argmax())]
    while len(out) < max_tokens:
        ctx = len(prompt) + len(out) - 1
        hidden, _ = thinker(thinker.embed(torch.tensor(out[-1:])), ForwardBatch.contiguous([1], [ctx]), kv)
        out.append(int(thinker.compute_logits(hidden).argmax()))
    return out


def run(
    engine: Engine,
    arrivals: dict[int, list[Request]],
    aborts: dict[int, list[str]] | None = None,
    max_steps: int = 10_000,
) -> dict[str, list[int]]:
    """Drive the engine: add requests at their arrival step, abort at theirs; collect outputs."""
    outputs: dict[str, list[int]] = {}
    step = 0
    while step < max_steps and (engine.has_unfinished() or any(k >= step for k in arrivals)):
        for req in arrivals.get(step, []):
            engine.add_request(req)
            outputs[req.request_id] = []
        for rid in (aborts or {}).get(step, []):
            engine.abort(rid)
        for o in engine.step():
            outputs[o.request_id].extend(o.new_token_ids)
        step += 1
    return outputs


def test_block_allocator_refcounts():
    a = BlockAllocator(4)
    x = a.allocate(3)
    shared = a.fork(x[:2])
    a.free(x)
    assert a.num_free == 2  # the two shared blocks are still held
    a.free(shared)
    assert a.num_free == 4
    with pytest.raises(NoFreeBlocks):
        a.allocate(5)
    with pytest.raises(ValueError):
        a.free([0])


def test_engine_matches_sequential_reference(thinker):
    prompts = _prompts(6, seed=1)
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=64)
    reqs = [Request(f"r{i}", p, SamplingParams(max_tokens=12)) for i, p in enumerate(prompts)]
    got = run(engine, {0: reqs[:3], 2: reqs[3:]})
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == sequential_greedy(thinker, p, 12)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(12, 40), budget=st.sampled_from([7, 32, 256]))
def test_batch_of_32_with_preemption_and_aborts_equals_alone(thinker, seed, num_blocks, budget):
    rng = random.Random(seed)
    prompts = _prompts(32, seed)
    params = [
        SamplingParams(
            max_tokens=rng.randrange(1, 10),
            temperature=rng.choice([0.0, 0.8]),
            top_k=rng.choice([0, 20]),
            top_p=rng.choice([1.0, 0.9]),
            seed=1000 + i,
            repetition_penalty=rng.choice([1.0, 1.3]),
        )
        for i in range(32)
    ]
    alone = {}
    for i, p in enumerate(prompts):
        e = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_batched_tokens=256)
        alone.update(run(e, {0: [Request(f"r{i}", p, params[i])]}))
    engine = Engine(
        DecoderLMAdapter(thinker), num_blocks=num_blocks, max_num_seqs=32, max_num_batched_tokens=budget
    )
    arrivals: dict[int, list[Request]] = {}
    for i, p in enumerate(prompts):
        arrivals.setdefault(rng.randrange(0, 12), []).append(Request(f"r{i}", p, params[i]))
    aborted = rng.sample(range(32), 4)
    aborts = {rng.randrange(0, 15): [f"r{i}" for i in aborted]}
    got = run(engine, arrivals, aborts)
    for i in range(32):
        rid = f"r{i}"
        if i in aborted:
            assert got[rid] == alone[rid][: len(got[rid])]  # a prefix of the full output, then nothing
        else:
            assert got[rid] == alone[rid], rid
    assert engine.scheduler.allocator.num_free == num_blocks  # every block returned
    assert not engine.has_unfinished()


def test_preemption_happens_and_is_transparent(thinker):
    prompts = _prompts(8, seed=5)
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=10, max_num_batched_tokens=128)
    reqs = [Request(f"r{i}", p, SamplingParams(max_tokens=16)) for i, p in enumerate(prompts)]
    got = run(engine, {0: reqs})
    assert sum(r.num_preemptions for r in reqs) > 0
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == sequential_greedy(thinker, p, 16)


def test_abort_frees_blocks_within_the_step(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=32)
    engine.add_request(Request("a", list(range(30)), SamplingParams(max_tokens=50)))
    engine.step()
    assert engine.scheduler.allocator.num_free < 32
    assert engine.abort("a")
    assert engine.scheduler.allocator.num_free == 32
    assert not engine.abort("a")
    assert engine.step() == []


def test_bad_requests_are_refused(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=4)
    with pytest.raises(ValueError, match="outside vocabulary"):
        engine.add_request(Request("x", [10_000]))
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request(Request("y", list(range(100)), SamplingParams(max_tokens=10)))
    with pytest.raises(ValueError, match="empty prompt"):
        Request("z", [])
    engine.add_request(Request("ok", [1, 2, 3], SamplingParams(max_tokens=2)))
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request(Request("ok", [1]))


def test_stop_tokens_and_max_tokens(thinker):
    ref = sequential_greedy(thinker, [5, 6, 7], 10)
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=16)
    stop = ref[3]
    req = Request("s", [5, 6, 7], SamplingParams(max_tokens=10, stop_token_ids=(stop,)))
    got = run(engine, {0: [req]})
    assert got["s"] == ref[: ref.index(stop) + 1]
    assert req.status.value == "stop"

    fixed = Request("f", [5, 6, 7], SamplingParams(max_tokens=10, stop_token_ids=(stop,), ignore_eos=True))
    got = run(engine, {0: [fixed]})["f"]
    assert len(got) == 10 and stop not in got and fixed.status.value == "length"
    first = ref.index(stop)
    assert got[:first] == ref[:first]  # the same greedy path up to where the stop id won
