"""Automatic prefix caching: hash-chained full blocks shared across requests, evicted LRU under pressure.

Outputs are the same with caching on and off (hypothesis over prompts sharing prefixes, with preemption,
eviction and aborts); reference counts return to zero and the pool is whole after every request ends; a
session's next turn computes only its new tokens (engine counters), for ids, embeddings, the Thinker's
Talker-facing hidden states, the unified LM's multi-stream steps and the cascade LLM stage.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.block_manager import BlockAllocator
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.prefix_cache import chain_hash, default_row_key
from omniduplex.pipeline.engine.request import Request, SamplingParams

B = 16  # tokens per KV block


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("text"), "tiny", seed=3, text_only=True)
    return load_model(d).thinker


def run(engine: Engine, arrivals: dict[int, list[Request]], aborts: dict[int, list[str]] | None = None):
    """Drive the engine; returns ``{request_id: output ids}`` and ``{request_id: num_cached_tokens}``."""
    outputs: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    step = 0
    while engine.has_unfinished() or any(k >= step for k in arrivals):
        for req in arrivals.get(step, []):
            engine.add_request(req)
            outputs[req.request_id] = []
        for rid in (aborts or {}).get(step, []):
            engine.abort(rid)
        for o in engine.step():
            outputs[o.request_id].extend(o.new_token_ids)
            if o.num_cached_tokens is not None:
                cached[o.request_id] = o.num_cached_tokens
        step += 1
        assert step < 20_000
    return outputs, cached


def assert_pool_whole(engine: Engine) -> None:
    alloc = engine.scheduler.allocator
    assert alloc.num_free == alloc.num_blocks
    assert all(alloc.refcount(b) == 0 for b in range(alloc.num_blocks))
    assert not engine.has_unfinished() and not engine.scheduler.requests


def one(engine: Engine, rid: str, prompt: list[int], max_tokens: int, **kw) -> tuple[list[int], int]:
    out, cached = run(engine, {0: [Request(rid, prompt, SamplingParams(max_tokens=max_tokens), **kw)]})
    return out[rid], cached[rid]


# -- the allocator ---------------------------------------------------------------------------------------
def test_cached_free_blocks_stay_findable_and_are_evicted_lru_only_when_needed():
    a = BlockAllocator(4)
    x, y = a.allocate(1)[0], a.allocate(1)[0]
    assert a.register(x, b"x") and a.register(y, b"y")
    assert not a.register(x, b"other") and a.num_cached == 2
    a.free([y])
    a.free([x])  # released after y: y is the least recently used
    assert a.num_free == 4 and a.lookup(b"x") == x and a.lookup(b"y") == y
    fresh = a.allocate(2)  # the never-cached blocks go first
    assert set(fresh).isdisjoint({x, y}) and a.num_evictions == 0
    a.touch(x)  # revived: leaves the free pool
    assert a.refcount(x) == 1 and a.num_free == 1
    (z,) = a.allocate(1)  # evicts y, the only cached free block
    assert z == y and a.lookup(b"y") is None and a.num_evictions == 1
    a.touch(x)
    assert a.refcount(x) == 2
    a.free([x, x, z, *fresh])
    assert a.num_free == 4 and a.lookup(b"x") == x
    with pytest.raises(ValueError):
        a.register(x, b"free")


def test_chain_hash_covers_the_whole_prefix_and_the_content():
    ids = list(range(B))
    h0 = chain_hash(None, ids)
    assert chain_hash(None, ids) == h0 and len(h0) == 16
    assert chain_hash(h0, ids) != chain_hash(chain_hash(None, ids[::-1]), ids)  # parent matters
    assert chain_hash(None, ids, b"audio") != h0 != chain_hash(None, ids[:-1] + [99])
    emb = torch.randn(20, 4)
    req = Request("r", list(range(20)), prompt_embeds=emb)
    key = default_row_key(req, 0, B)
    assert key == default_row_key(Request("s", list(range(20)), prompt_embeds=emb.clone()), 0, B)
    emb2 = emb.clone()
    emb2[3, 1] += 1e-3
    assert key != default_row_key(Request("t", list(range(20)), prompt_embeds=emb2), 0, B)
    assert default_row_key(Request("u", [1, 2]), 0, 2) is None


# -- the engine ------------------------------------------------------------------------------------------
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_outputs_equal_with_and_without_caching(thinker, data):
    """Prompts sharing prefixes of a common base, staggered arrivals, a small pool (preemption, eviction)
    and aborts: every finished request's ids equal those of a no-caching engine; the pool is whole after."""
    base = data.draw(st.lists(st.integers(0, 255), min_size=0, max_size=70), label="base")
    n = data.draw(st.integers(2, 10), label="n")
    jobs = []
    for _ in range(n):
        k = data.draw(st.integers(0, len(base)))
        tail = data.draw(st.lists(st.integers(0, 255), min_size=0 if k else 1, max_size=20))
        temperature = data.draw(st.sampled_from([0.0, 0.8]))
        sp = dict(max_tokens=data.draw(st.integers(1, 12)), temperature=temperature)
        jobs.append((base[:k] + tail, sp, data.draw(st.integers(0, 30))))
    num_blocks = data.draw(st.integers(9, 40), label="num_blocks")
    budget = data.draw(st.sampled_from([7, 32, 256]), label="budget")
    aborted = data.draw(st.sets(st.integers(0, n - 1), max_size=2), label="aborted")
    abort_at = data.draw(st.integers(0, 30))

    def reqs():
        return {
            i: Request(f"r{i}", p, SamplingParams(seed=100 + i, **sp)) for i, (p, sp, _) in enumerate(jobs)
        }

    off = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_seqs=16, enable_prefix_caching=False)
    ref, _ = run(off, {0: list(reqs().values())})
    on = Engine(
        DecoderLMAdapter(thinker), num_blocks=num_blocks, max_num_seqs=16, max_num_batched_tokens=budget
    )
    arrivals: dict[int, list[Request]] = {}
    for i, r in reqs().items():
        arrivals.setdefault(jobs[i][2], []).append(r)
    got, _ = run(on, arrivals, {abort_at: [f"r{i}" for i in aborted]})
    for i in range(n):
        rid = f"r{i}"
        if i in aborted:
            assert got[rid] == ref[rid][: len(got[rid])]
        else:
            assert got[rid] == ref[rid], rid
    assert_pool_whole(on)


def test_shared_prefix_preemption_and_eviction_are_transparent(thinker):
    """A system-prompt-like shared prefix, a pool too small for everyone: preemptions and evictions happen,
    reuse happens, and the greedy outputs equal a no-caching engine's."""
    rng = random.Random(7)
    system = [rng.randrange(256) for _ in range(40)]
    prompts = [system + [rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(12)]
    reqs = lambda: [Request(f"r{i}", p, SamplingParams(max_tokens=16)) for i, p in enumerate(prompts)]  # noqa: E731
    ref, _ = run(Engine(DecoderLMAdapter(thinker), num_blocks=128, enable_prefix_caching=False), {0: reqs()})
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=14, max_num_batched_tokens=64)
    waves = reqs()
    got, cached = run(engine, {0: waves[:6], 40: waves[6:]})
    assert got == ref
    sched = engine.scheduler
    assert sched.num_preemptions > 0 and sched.allocator.num_evictions > 0
    assert sched.num_reused_tokens > 0 and max(cached.values()) >= 32
    assert_pool_whole(engine)


def test_refcounts_follow_sharers_and_blocks_outlive_their_requests(thinker):
    prefix = list(range(1, 49))  # three full blocks
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=32)
    alloc = engine.scheduler.allocator
    engine.add_request(Request("a", prefix + [7, 8], SamplingParams(max_tokens=30)))
    engine.step()  # a's prompt is computed and its three full blocks registered
    a = engine.scheduler.requests["a"]
    engine.add_request(Request("b", prefix + [9], SamplingParams(max_tokens=30)))
    engine.step()
    b = engine.scheduler.requests["b"]
    assert b.num_cached_tokens == 48 and b.blocks[:3] == a.blocks[:3]
    assert [alloc.refcount(x) for x in a.blocks[:3]] == [2, 2, 2]
    assert engine.abort("a")
    assert [alloc.refcount(x) for x in b.blocks[:3]] == [1, 1, 1]
    assert engine.abort("b")
    assert_pool_whole(engine)
    assert alloc.num_cached >= 3  # still findable after their requests ended
    _, cached = one(engine, "c", prefix + [1, 2, 3], 4)
    assert cached == 48
    assert_pool_whole(engine)


def test_a_second_turn_computes_only_its_new_tokens(thinker):
    """Turn 2 = turn 1's prompt + its reply + a new user message: the engine reports prefill of the
    uncached tail only, and the reply equals the no-caching one."""
    rng = random.Random(3)
    p1 = [rng.randrange(256) for _ in range(45)]
    off = Engine(DecoderLMAdapter(thinker), num_blocks=64, enable_prefix_caching=False)
    on = Engine(DecoderLMAdapter(thinker), num_blocks=64)
    r1, cached1 = one(on, "t1", p1, 20)
    assert cached1 == 0 and on.num_prefill_tokens == 45
    assert r1 == one(off, "t1", p1, 20)[0]
    p2 = p1 + r1 + [rng.randrange(256) for _ in range(9)]  # 74 tokens
    # turn 1 computed its prompt and every reply token but the last: 45 + 19 = 64 rows, 4 full blocks
    before = on.num_prefill_tokens
    r2, cached2 = one(on, "t2", p2, 10)
    assert cached2 == 64
    assert on.num_prefill_tokens - before == len(p2) - 64 == 10
    assert r2 == one(off, "t2", p2, 10)[0]
    # the same prompt again: everything but the last block is reused (its last row must be recomputed)
    before = on.num_prefill_tokens
    _, cached3 = one(on, "t3", p2, 2)
    assert cached3 == 64 and on.num_prefill_tokens - before == 10
    p4 = list(range(64))  # exactly 4 blocks: the last one is recomputed for the logits of its last row
    one(on, "t4", p4, 2)
    before = on.num_prefill_tokens
    _, cached4 = one(on, "t5", p4, 2)
    assert cached4 == 48 and on.num_prefill_tokens - before == 16
    assert_pool_whole(on)


def test_a_longer_prompt_reuses_every_shared_row_of_a_partly_filled_last_block(thinker):
    """A request's last, partly filled block stays findable after it ends: a prompt extending it (or sharing
    some of its rows) reuses exactly the shared rows; the block is taken over, not shared (the newcomer writes
    its rows), so a second taker finds only the full blocks; outputs equal a no-caching engine's."""
    rng = random.Random(5)
    hint = [rng.randrange(256) for _ in range(40)]  # two full blocks + 8 rows
    turn = hint + [rng.randrange(256) for _ in range(5)]
    off = Engine(DecoderLMAdapter(thinker), num_blocks=64, enable_prefix_caching=False)
    on = Engine(DecoderLMAdapter(thinker), num_blocks=64)
    one(on, "hint", hint, 1)  # computes its 40 prompt rows, then lets them go
    before = on.num_prefill_tokens
    out, cached = one(on, "turn", turn, 6)
    assert cached == 40 and on.num_prefill_tokens - before == 5
    assert out == one(off, "turn", turn, 6)[0]
    _, cached = one(on, "hint2", hint, 1)  # the turn took the first hint's block: only full blocks remain
    assert cached == 32
    fork = hint[:37] + [(hint[37] + 1) % 256] + hint[38:]  # differs at row 37 of the hint2's partial block
    before = on.num_prefill_tokens
    out, cached = one(on, "fork", fork, 4)
    assert cached == 37 and on.num_prefill_tokens - before == 3
    assert out == one(off, "fork", fork, 4)[0]
    assert_pool_whole(on)


def test_caching_off_reuses_nothing(thinker):
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=32, enable_prefix_caching=False)
    one(engine, "a", list(range(40)), 3)
    _, cached = one(engine, "b", list(range(40)), 3)
    assert cached == 0 and engine.num_prefill_tokens == 80 and engine.scheduler.allocator.num_cached == 0


def test_embedding_rows_are_keyed_by_content(thinker):
    """Prompt rows given as embeddings (audio merged into a Thinker prompt) match only on equal content."""
    ids = list(range(10, 60))  # 50 rows, 3 full blocks
    emb = thinker.embed(torch.tensor(ids)).detach().clone()
    other = emb.clone()
    other[20] += 0.5  # an "audio" row in block 1 differs
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=32)
    off = Engine(DecoderLMAdapter(thinker), num_blocks=32, enable_prefix_caching=False)
    one(engine, "a", ids, 4, prompt_embeds=emb)
    out_b, cached_b = one(engine, "b", ids, 4, prompt_embeds=other)
    assert cached_b == 16  # block 0 only: the chain breaks at the differing row
    assert out_b == one(off, "b", ids, 4, prompt_embeds=other)[0]
    out_c, cached_c = one(engine, "c", ids, 4, prompt_embeds=emb.clone())
    assert cached_c == 48 and out_c == one(off, "c", ids, 4, prompt_embeds=emb)[0]
    assert_pool_whole(engine)


def test_thinker_capture_reuses_only_rows_the_talker_does_not_read(thinker):
    """With the Talker's hidden-state capture on, rows from ``capture_from`` on are always computed (their
    hidden states equal the no-caching run's); rows before it come from the cache as zeros."""
    ids = list(range(30, 100))  # 70 rows
    outs = {}
    for caching in (True, False):
        adapter = DecoderLMAdapter(thinker, capture_layer=1)
        engine = Engine(adapter, num_blocks=32, enable_prefix_caching=caching)
        got = {}
        for rid, capture_from in (("warm", 0), ("a", 0), ("b", 40)):
            req = Request(rid, ids, SamplingParams(max_tokens=3))
            req.extra["capture_from"] = capture_from
            engine.add_request(req)
            while engine.has_unfinished():
                for o in engine.step():
                    if "prompt_hidden" in o.extras:
                        got[rid] = (o.extras["prompt_hidden"], o.num_cached_tokens)
        outs[caching] = got
        assert_pool_whole(engine)
    assert outs[True]["a"][1] == 0  # capture_from 0: nothing may be skipped
    hidden_b, cached_b = outs[True]["b"]
    assert cached_b == 32  # two full blocks before row 40
    assert hidden_b.shape == outs[False]["b"][0].shape == (70, thinker.cfg.hidden_size)
    assert torch.equal(hidden_b[:32], torch.zeros_like(hidden_b[:32]))
    torch.testing.assert_close(hidden_b[32:], outs[False]["b"][0][32:])


# -- the unified LM: multi-stream step rows -------------------------------------------------------------
@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from omniduplex.models.unified.presets import write_unified_checkpoint

    lm = load_model(write_unified_checkpoint(tmp_path_factory.mktemp("u"), "tiny", seed=1)).unified
    cfg = lm.cfg
    with torch.no_grad():  # speech starts through the text budget (as tests/test_unified_engine.py)
        lm.lm_head.weight[list(range(cfg.text_vocab_size, cfg.vocab_size))] *= 0.1
        lm.lm_head.weight[[cfg.speech_start_token_id, *cfg.bridge_token_ids]] *= 0.1
    return lm


def test_unified_steps_are_keyed_on_every_stream_and_equal_the_reference(lm):
    from omniduplex.models.unified.reference import generate
    from omniduplex.pipeline.engine.unified_adapter import UnifiedAdapter

    cfg, s = lm.cfg, lm.cfg.num_streams
    rng = random.Random(5)
    steps = torch.full((40, s), -1, dtype=torch.int64)
    steps[:, 0] = torch.tensor([rng.randrange(1, 200) for _ in range(40)])
    for i in range(1, s):
        steps[8:, i] = cfg.stream_offset(i) + torch.randint(0, cfg.codebook_size, (32,))
    changed = steps.clone()
    changed[20, s - 1] = cfg.stream_offset(s - 1) + (int(steps[20, s - 1]) - cfg.stream_offset(s - 1) + 1) % (
        cfg.codebook_size
    )  # block 1 differs in an auxiliary stream only
    adapter = UnifiedAdapter(lm, max_len=96)
    engine = Engine(adapter, num_blocks=64, max_num_seqs=8)
    got = {}
    for rid, prompt, w in (("a", steps, 1.0), ("b", steps, 2.5), ("c", changed, 1.0), ("d", steps, 1.0)):
        engine.add_request(adapter.make_request(rid, prompt, 2, 4, cfg_scale=w))
        got[rid] = [[], None]
        while engine.has_unfinished():
            for o in engine.step():
                got[o.request_id][0].append(o.extras["step"])
                if o.num_cached_tokens is not None:
                    got[o.request_id][1] = o.num_cached_tokens
    assert [got[r][1] for r in "abcd"] == [0, 32, 16, 32]
    for rid, prompt, w in (("a", steps, 1.0), ("b", steps, 2.5), ("c", changed, 1.0), ("d", steps, 1.0)):
        assert got[rid][0] == generate(lm, prompt, 2, 4, cfg_scale=w).steps.tolist(), rid
    assert_pool_whole(engine)


# -- the cascade's LLM stage on the real SmolLM2 weights -------------------------------------------------
@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.weights import SMOLLM2_135M, WeightsError, locate

    try:
        src = locate(SMOLLM2_135M)
    except WeightsError as e:
        pytest.skip(str(e))
    return load_model(cached_import(src, tmp_path_factory.mktemp("gguf-cache")), parts=("thinker",))


def test_llm_stage_next_turn_reuses_its_history(smollm):
    """The chat template renders a conversation's earlier turns as the same tokens, so turn 2 computes
    only what follows its last full cached block; the reply equals the no-caching reply."""
    from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.llm import LLMWorker

    def turn(worker, rid, transcript, history):
        opts = TurnOptions(history=history, sampling={"max_tokens": 24})
        worker.submit(StageMessage(rid, {}, Transcript(transcript=transcript, turn=opts), last=True))
        outs = []
        while worker.has_work():
            outs += worker.step()
        return outs[0].tensors["prompt_ids"].tolist(), "".join(o.meta.text for o in outs)

    on = LLMWorker(smollm, EngineSettings(num_blocks=128, max_num_seqs=4, max_num_batched_tokens=256))
    off = LLMWorker(smollm, EngineSettings(num_blocks=128, max_num_seqs=4, enable_prefix_caching=False))
    p1, reply1 = turn(on, "t1", "What is the capital of France?", [])
    history = [["user", "What is the capital of France?"], ["assistant", reply1]]
    before = on.engine.num_prefill_tokens
    p2, reply2 = turn(on, "t2", "And of Italy?", history)
    assert p2[: len(p1)] == p1  # token-stable rendering of the history
    computed = on.engine.num_prefill_tokens - before
    cached = len(p2) - computed
    assert cached >= len(p1) and computed < len(p2) - len(p1)  # turn 1's rows, its last block's included
    assert (p1, reply1) == turn(off, "t1", "What is the capital of France?", [])
    assert (p2, reply2) == turn(off, "t2", "And of Italy?", history)
    assert_pool_whole(on.engine)


# -- the Thinker stage: text history reused, audio rows (read by the Talker) always computed --------------
def test_thinker_stage_reuses_the_text_history_before_the_audio(tmp_path):
    from omniduplex.models.qwen3_omni.talker_prompt import user_token_mask
    from omniduplex.models.tokenizer import load_tokenizer, voice_turn_prompt
    from omniduplex.pipeline.messages import Encoded, StageMessage, TurnOptions
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.thinker import ThinkerWorker

    d = write_checkpoint(tmp_path, "tiny", seed=0)
    model = load_model(d, parts=("thinker",))
    cfg, tok = model.config, load_tokenizer(d)
    hidden = cfg.thinker.text.hidden_size
    history = [("user", "hello there, " * 6), ("assistant", "hi, how can I help you today? " * 4)]
    more = history + [("user", "tell me a story"), ("assistant", "once upon a time " * 3)]

    def msg(rid, hist, n_audio, seed):
        ids = voice_turn_prompt(cfg, tok, n_audio, "You are a voice assistant.", hist)
        audio = torch.randn(n_audio, hidden, generator=torch.Generator().manual_seed(seed))
        t = {"prompt_ids": torch.tensor(ids, dtype=torch.int64), "audio_embeds": audio}
        return StageMessage(rid, t, Encoded(turn=TurnOptions(sampling={"max_tokens": 4})))

    def turn(worker, m):
        worker.submit(m)
        outs = []
        while worker.has_work():
            outs += worker.step()
        return [int(o.tensors["token"]) for o in outs], outs[0].tensors["prompt_hidden"]

    on = ThinkerWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256))
    off = ThinkerWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, enable_prefix_caching=False))
    turn(on, msg("b", history, 7, 1))
    before = on.engine.num_cached_tokens
    c = msg("c", more, 9, 2)
    got = turn(on, c)
    cached = on.engine.num_cached_tokens - before
    ids = c.tensors["prompt_ids"]
    read = user_token_mask(ids, cfg) & (ids == cfg.thinker.audio_token_id)
    first_audio = int(torch.nonzero(read)[0])
    assert cached > 0 and cached % B == 0 and cached <= first_audio  # the text history, up to the audio
    ref = turn(off, c)
    assert got[0] == ref[0]
    torch.testing.assert_close(got[1][read], ref[1][read])  # the rows the Talker reads are exact
    assert_pool_whole(on.engine)
