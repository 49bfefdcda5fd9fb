"""Speculative decoding in the engine: lossless under greedy (the same ids as without it, over many prompts,
batches mixing speculating and plain requests, preemption, stop ids), distribution-preserving under sampling
(chi-square of the emitted id against the target's distribution), KV of rejected rows returned to the pool."""

from __future__ import annotations

import random

import pytest
import torch

from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.block_manager import blocks_for
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.spec_draft import DraftModel
from omniduplex.pipeline.engine.spec_verify import target_probs, verify_greedy, verify_sampled
from omniduplex.pipeline.engine.speculative import SpeculativeConfig, Speculator, ngram_propose


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("target"), "tiny", seed=3, text_only=True)
    return load_model(d).thinker


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A second random model of the same vocabulary: a draft that often disagrees."""
    d = write_checkpoint(tmp_path_factory.mktemp("draft"), "tiny", seed=11, text_only=True)
    return load_model(d).thinker


def _prompts(n: int, seed: int) -> list[list[int]]:
    """Prompts with repeated spans (prompt lookup finds drafts in them) and plain random ones."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append([rng.randrange(0, 272) for _ in range(rng.randrange(1, 40))])
        else:
            span = [rng.randrange(0, 272) for _ in range(rng.randrange(3, 9))]
            out.append((span * 6)[: rng.randrange(len(span) + 2, 6 * len(span))])
    return out


def _engine(model, num_blocks=64, budget=256, spec=None, draft=None, prefix=True, max_num_seqs=32):
    speculator = None
    if spec is not None:
        dm = None
        if spec.method == "draft":
            dm = DraftModel(draft, spec.k, num_blocks, max_num_seqs, budget, torch.float32, "cpu")
        speculator = Speculator(spec, dm)
    return Engine(
        DecoderLMAdapter(model),
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=prefix,
        speculator=speculator,
    )


def _check_blocks(engine: Engine) -> None:
    """Block-manager invariants: each running request holds exactly the blocks of its computed rows, and
    every block's reference count is the number of block tables that hold it."""
    sched, alloc = engine.scheduler, engine.scheduler.allocator
    held: dict[int, int] = {}
    for req in sched.running:
        for r in req.group:
            assert len(r.blocks) == blocks_for(r.num_computed), (r.request_id, len(r.blocks), r.num_computed)
            for b in r.blocks:
                held[b] = held.get(b, 0) + 1
    for b in range(alloc.num_blocks):
        assert alloc.refcount(b) == held.get(b, 0), b
    assert alloc.num_free == alloc.num_blocks - len(held)


def _run(engine: Engine, arrivals: dict[int, list[Request]], check=True) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = {}
    step = 0
    while engine.has_unfinished() or any(k >= step for k in arrivals):
        for req in arrivals.get(step, []):
            engine.add_request(req)
            outputs[req.request_id] = []
        for o in engine.step():
            outputs[o.request_id].extend(o.new_token_ids)
        if check:
            _check_blocks(engine)
        step += 1
        assert step < 5000
    return outputs


def _requests(prompts, params, speculate=lambda i: True):
    return [Request(f"r{i}", p, params[i], speculate=speculate(i)) for i, p in enumerate(prompts)]


def test_ngram_propose_takes_the_latest_earlier_match():
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert ngram_propose(seq, 2) == [7, 8]  # after the latest earlier "1 2 3"
    assert ngram_propose(seq, 5, ngram_max=3) == [7, 8, 1, 2, 3]
    assert ngram_propose([4, 5, 6], 3) == []  # no earlier occurrence of any suffix
    assert ngram_propose([5, 5], 3) == [5]
    assert ngram_propose([1, 2, 1, 3], 2, ngram_max=2, ngram_min=2) == []  # "1 3" never seen


def test_config_parses_and_names_what_is_wrong():
    assert SpeculativeConfig.parse({"method": "ngram", "k": 3}) == SpeculativeConfig("ngram", 3)
    c = SpeculativeConfig.parse({"method": "draft", "draft": "/m/draft.gguf"})
    assert (c.method, c.k, c.draft) == ("draft", 4, "/m/draft.gguf")
    bad = [
        ("ngram", "must be a mapping"),
        ({"method": "medusa"}, "method must be one of ngram, draft"),
        ({"method": "ngram", "k": 0}, r"k must be an integer in \[1, 16\]"),
        ({"method": "ngram", "k": True}, "k must be an integer"),
        ({"method": "ngram", "kk": 2}, "unknown key 'kk'"),
        ({"method": "draft"}, "method draft needs 'draft'"),
        ({"method": "ngram", "draft": "x"}, "'draft' is for method draft"),
        ({"method": "ngram", "ngram_min": 3, "ngram_max": 2}, "ngram_min 3 > ngram_max 2"),
    ]
    for raw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            SpeculativeConfig.parse(raw, "llm_speculative")
    with pytest.raises(ValueError, match="needs a draft model"):
        Speculator(SpeculativeConfig("draft", 2, "x"))


@pytest.mark.parametrize("method", ["ngram", "draft", "self"])
def test_greedy_is_lossless_mixed_batches_stop_ids_and_preemption(target, other, method):
    """Same ids as the engine without speculation: 24 prompts arriving over time, every third request not
    speculating, some with a stop id, a small cache (preemptions) and a small token budget."""
    prompts = _prompts(24, seed=7)
    rng = random.Random(1)
    params = [SamplingParams(max_tokens=rng.randrange(2, 24)) for _ in prompts]
    plain = _run(_engine(target), {0: _requests(prompts, params)}, check=False)
    for i in range(0, 24, 5):  # stop at an id the request does produce
        params[i].stop_token_ids = (plain[f"r{i}"][len(plain[f"r{i}"]) // 2],)
    base = _run(_engine(target), {0: _requests(prompts, params)}, check=False)
    for num_blocks, budget in ((96, 256), (14, 40)):
        spec = SpeculativeConfig("ngram" if method == "ngram" else "draft", k=4, draft="x")
        engine = _engine(target, num_blocks, budget, spec, draft=other if method == "draft" else target)
        reqs = _requests(prompts, params, speculate=lambda i: i % 3 != 1)
        arrivals: dict[int, list[Request]] = {}
        for r in reqs:
            arrivals.setdefault(rng.randrange(0, 8), []).append(r)
        got = _run(engine, arrivals)
        assert got == base
        assert engine.scheduler.allocator.num_free == num_blocks  # every block back, rejected rows included
        assert all(r.num_draft_tokens == 0 for i, r in enumerate(reqs) if i % 3 == 1)
        drafted = sum(r.num_draft_tokens for r in reqs)
        accepted = sum(r.num_accepted_tokens for r in reqs)
        assert drafted == engine.spec.num_drafted and accepted == engine.spec.num_accepted
        assert engine.spec.num_emitted == engine.spec.num_verified + accepted
        assert drafted > 0
        if method == "ngram":
            assert 0 < accepted < drafted
        if method == "self":  # the target as its own draft: it agrees with itself
            assert accepted >= 0.9 * drafted
        if num_blocks == 14:
            assert engine.scheduler.num_preemptions > 0
        if method != "draft":  # several ids in some steps (two random models hardly ever agree)
            assert sum(len(v) for v in got.values()) > engine.num_steps


def test_rollback_returns_the_blocks_of_rejected_rows(target, other):
    """A long request whose drafts cross block boundaries: after every step it holds exactly the blocks of its
    kept rows (rejected rows' blocks went back to the pool), and its outputs are the plain engine's."""
    prompt = list(range(5, 35)) * 2
    spec = SpeculativeConfig("draft", k=8, draft="x")
    engine = _engine(other, 32, 256, spec, draft=target, prefix=False)
    req = Request("long", prompt, SamplingParams(max_tokens=120, ignore_eos=True))
    got = _run(engine, {0: [req]})  # _check_blocks after every step
    base = _run(_engine(other, prefix=False), {0: [Request("long", prompt, req.sampling)]}, check=False)
    assert got == base
    assert req.num_draft_tokens > req.num_accepted_tokens  # some rows were rejected (and rolled back)
    # drafts that keep failing back off (1, 2, 4, 8 steps without drafts): most steps are plain decodes
    assert req.num_accepted_tokens < 0.1 * req.num_draft_tokens
    assert engine.spec.num_verified < engine.num_steps / 3
    assert engine.scheduler.allocator.num_free == 32


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs`` (cells expecting < 5 merged)."""
    n = float(counts.sum())
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([counts.double()[big], counts.double()[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


@pytest.mark.parametrize("deterministic", [False, True])
def test_sampled_ids_follow_the_target_distribution(deterministic):
    """Speculative sampling emits each id with the target's probability: a chi-square test over 8 ids of the
    first emitted id (any draft) and of the second (given the first draft kept), with fixed seeds."""
    g = torch.Generator().manual_seed(5)
    vocab, k = 8, 2
    logits = torch.randn(k + 1, vocab, generator=g) * 1.5
    sp = SamplingParams(temperature=0.9, top_k=0, top_p=1.0)
    p = target_probs(logits, sp)
    draft_logits = torch.randn(k, vocab, generator=g)
    q = None if deterministic else target_probs(draft_logits, sp)
    fixed = [int(p[0].argmax()), 5]  # kept often enough to test the id after it too
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    trials = 6000
    for t in range(trials):
        sp.seed = 1000 + t
        # prompt lookup proposes fixed ids; a draft model samples its ids from q (its own noise)
        drafts = fixed if q is None else [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
        out = verify_sampled(logits, drafts, q, sp, position=4)
        first[out[0]] += 1
        if len(out) > 1:  # the first draft was kept: the next id is distributed as p_1
            second[out[1]] += 1
    assert _chi_square_p(first, p[0]) > 1e-3
    assert _chi_square_p(second, p[1]) > 1e-3
    # the test has power: the draft's own distribution (or the point mass) is rejected
    wrong = torch.zeros(vocab)
    wrong[fixed[0]] = 1.0
    assert _chi_square_p(first, wrong if q is None else q[0]) < 1e-6
    # acceptance matches the theory: E[min(1, p/q)] = sum min(p, q)
    accept = float(torch.minimum(p[0], q[0]).sum()) if q is not None else float(p[0, fixed[0]])
    assert abs(second.sum() / trials - accept) < 4 * (accept * (1 - accept) / trials) ** 0.5 + 1e-9


def test_greedy_rule_keeps_the_agreeing_prefix():
    logits = torch.full((4, 6), -1.0)
    for row, best in enumerate([2, 4, 1, 5]):
        logits[row, best] = 3.0
    assert verify_greedy(logits, [2, 4, 0]) == [2, 4, 1]
    assert verify_greedy(logits, [2, 4, 1]) == [2, 4, 1, 5]
    assert verify_greedy(logits, [0, 4, 1]) == [2]


def test_sampled_requests_with_the_target_as_draft_keep_almost_every_draft(target):
    """Under sampling, a draft equal to the target (q = p) is always accepted (min(1, p/q) = 1); the outputs
    depend only on each request's seed: the same alone and batched with other sampled and plain peers."""
    prompts = _prompts(9, seed=3)
    params = [
        SamplingParams(max_tokens=16, temperature=0.8, top_k=[0, 20][i % 2], seed=50 + i) for i in range(9)
    ]
    spec = SpeculativeConfig("draft", k=3, draft="x")
    engine = _engine(target, 96, 256, spec, draft=target)
    reqs = _requests(prompts, params, speculate=lambda i: i != 4)
    got = _run(engine, {0: reqs[:5], 3: reqs[5:]})
    drafted, accepted = engine.spec.num_drafted, engine.spec.num_accepted
    assert drafted > 20 and accepted >= 0.95 * drafted
    for i in (0, 5, 8):
        alone = _engine(target, 96, 256, SpeculativeConfig("draft", k=3, draft="x"), draft=target)
        r = Request(f"r{i}", prompts[i], SamplingParams(**{**vars(params[i])}))
        assert _run(alone, {0: [r]})[f"r{i}"] == got[f"r{i}"]
    assert engine.scheduler.allocator.num_free == 96


def test_engine_refuses_a_speculator_its_adapter_cannot_take(target):
    with pytest.raises(ValueError, match="does not support speculative decoding"):
        Engine(
            DecoderLMAdapter(target, capture_layer=1),
            num_blocks=8,
            speculator=Speculator(SpeculativeConfig("ngram")),
        )
