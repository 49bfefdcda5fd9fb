"""The unified LM in the continuous-batching engine equals the sequential reference: with and without
CFG, alone and in mixed batches with staggered arrivals and aborts; aborting a main request drops its
hidden companion too."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from omniduplex.models.registry import load_model
from omniduplex.models.unified.presets import write_unified_checkpoint
from omniduplex.models.unified.reference import generate
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.unified_adapter import UnifiedAdapter


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    lm = load_model(write_unified_checkpoint(tmp_path_factory.mktemp("u"), "tiny", seed=1)).unified
    cfg = lm.cfg
    with torch.no_grad():  # speech starts through the text budget (see tests/test_unified.py::_text_first)
        lm.lm_head.weight[list(range(cfg.text_vocab_size, cfg.vocab_size))] *= 0.1
        lm.lm_head.weight[[cfg.speech_start_token_id, *cfg.bridge_token_ids]] *= 0.1
    return lm


@pytest.fixture(scope="module")
def text_only_lm(lm):
    m = copy.deepcopy(lm)
    with torch.no_grad():
        m.lm_head.weight[m.cfg.eos_token_id] *= 50.0
    return m


def _jobs(n: int, seed: int):
    rng = random.Random(seed)
    return [
        dict(
            prompt=[rng.randrange(1, 200) for _ in range(rng.randrange(1, 12))],
            max_text=rng.randrange(0, 4),
            frames=rng.randrange(1, 7),
            cfg=rng.choice([1.0, 1.0, 2.5]),
        )
        for _ in range(n)
    ]


def _run(lm, jobs, arrivals=None, aborts=None, num_blocks=64, budget=64):
    adapter = UnifiedAdapter(lm, max_len=64)
    engine = Engine(adapter, num_blocks=num_blocks, max_num_seqs=16, max_num_batched_tokens=budget)
    steps = {i: [] for i in range(len(jobs))}
    codes = {i: [] for i in range(len(jobs))}
    arrivals = arrivals or {0: list(range(len(jobs)))}
    t = 0
    while engine.has_unfinished() or any(k >= t for k in arrivals):
        for i in arrivals.get(t, []):
            j = jobs[i]
            engine.add_request(
                adapter.make_request(str(i), j["prompt"], j["max_text"], j["frames"], j["cfg"])
            )
        for i in (aborts or {}).get(t, []):
            engine.abort(str(i))
        for o in engine.step():
            steps[int(o.request_id)].append(o.extras["step"])
            if "codes" in o.extras:
                codes[int(o.request_id)].append(o.extras["codes"])
        t += 1
    return steps, codes, engine


def test_engine_equals_reference_with_and_without_cfg(lm):
    jobs = _jobs(6, 0)
    jobs[0]["cfg"], jobs[1]["cfg"] = 1.0, 3.0
    steps, codes, engine = _run(lm, jobs, arrivals={0: [0, 1, 2], 2: [3], 5: [4, 5]})
    for i, j in enumerate(jobs):
        ref = generate(lm, j["prompt"], j["max_text"], j["frames"], cfg_scale=j["cfg"])
        assert steps[i] == ref.steps.tolist(), i
        streamed = [list(c) for c in zip(*codes[i])] if codes[i] else [[] for _ in range(lm.cfg.num_streams)]
        assert streamed == ref.codes.tolist()  # frames stream out de-interleaved, one per step
    assert engine.scheduler.allocator.num_free == 64


def test_mixed_batch_text_only_audio_cfg_with_preemption_and_aborts(lm, text_only_lm):
    jobs = _jobs(10, 3)
    for j in jobs[:4]:
        j["cfg"] = 2.0
    rng = random.Random(1)
    arrivals = {}
    for i in range(len(jobs)):
        arrivals.setdefault(rng.randrange(0, 6), []).append(i)
    steps, _, engine = _run(lm, jobs, arrivals, aborts={4: ["0", "5"]}, num_blocks=8, budget=24)
    for i, j in enumerate(jobs):
        ref = generate(lm, j["prompt"], j["max_text"], j["frames"], cfg_scale=j["cfg"]).steps.tolist()
        if i in (0, 5):
            assert steps[i] == ref[: len(steps[i])]
        else:
            assert steps[i] == ref, i
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.allocator.num_free == 8  # companions of aborted requests freed too
    assert not engine.scheduler.requests
    # text-only turns (the model ends its text on EOS) beside speaking ones
    t_steps, t_codes, _ = _run(text_only_lm, _jobs(3, 4))
    for i, j in enumerate(_jobs(3, 4)):
        ref = generate(text_only_lm, j["prompt"], j["max_text"], j["frames"], cfg_scale=j["cfg"])
        assert t_steps[i] == ref.steps.tolist()


def test_companion_is_hidden_and_paired(lm):
    adapter = UnifiedAdapter(lm, max_len=64)
    engine = Engine(adapter, num_blocks=32)
    req = adapter.make_request("a", [5, 6, 7], 1, 3, cfg_scale=2.0)
    engine.add_request(req)
    seen = set()
    while engine.has_unfinished():
        plan_ids = None
        outs = engine.step()
        seen |= {o.request_id for o in outs}
        del plan_ids
    assert seen == {"a"}
    assert req.companion.output_ids == req.output_ids
    assert not engine.abort("a#cfg")  # the companion is not addressable


def test_cfg_merge_on_hidden_states_equals_merge_on_logits(lm):
    """The engine merges ``w·h_c + (1−w)·h_u`` before the bias-free shared head; that must equal the
    specified logit merge ``w·W(h_c + e_i) + (1−w)·W(h_u + e_i)`` for every stream."""
    from omniduplex.models.unified.phases import merge_cfg

    g = torch.Generator().manual_seed(0)
    h_c, h_u = (torch.randn(5, lm.cfg.decoder.hidden_size, generator=g) for _ in range(2))
    active = torch.tensor([True, False, True, True, False])
    scale = torch.tensor([3.0, 3.0, 1.5, 7.0, 2.0])
    p, x = lm.decode_logits(merge_cfg(h_c, h_u, scale, active))
    (pc, xc), (pu, xu) = lm.decode_logits(h_c), lm.decode_logits(h_u)
    torch.testing.assert_close(p, merge_cfg(pc, pu, scale, active), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x, merge_cfg(xc, xu, scale, active), rtol=1e-4, atol=1e-4)
    assert lm.lm_head.bias is None


def test_bfloat16_engine_runs_cfg_turns_to_complete_frames(tmp_path):
    """Serving dtype: bf16 weights and KV cache; CFG and plain turns in one batch end with every frame."""
    lm16 = load_model(write_unified_checkpoint(tmp_path, "tiny", seed=1), dtype=torch.bfloat16).unified
    adapter = UnifiedAdapter(lm16, max_len=64)
    engine = Engine(adapter, num_blocks=64, dtype=torch.bfloat16)
    for i, w in enumerate((1.0, 3.0, 3.0)):
        engine.add_request(adapter.make_request(str(i), [5 + i, 6, 7], 0, 6, cfg_scale=w))
    frames: dict[str, list] = {}
    done = set()
    while engine.has_unfinished():
        for o in engine.step():
            if "codes" in o.extras:
                frames.setdefault(o.request_id, []).append(o.extras["codes"])
            if o.finished:
                done.add(o.request_id)
    assert done == {"0", "1", "2"}
    cb = lm16.cfg.codebook_size
    for rid in done:
        assert len(frames[rid]) == 6
        assert all(len(f) == lm16.cfg.num_streams and all(0 <= c < cb for c in f) for f in frames[rid])
    assert engine.scheduler.allocator.num_free == 64


def test_lazy_companion_skips_text_and_catches_up_in_one_chunk(lm):
    """Through TEXT and TRANSITION the companion never runs; in the step after the last bridge token it
    prefills everything it skipped in one chunk beside its main request's decode; output = reference."""
    adapter = UnifiedAdapter(lm, max_len=64)
    engine = Engine(adapter, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)
    req = adapter.make_request("a", [5, 6, 7, 8], 5, 4, cfg_scale=3.0)
    engine.add_request(req)
    comp, n_bridge = req.companion, len(lm.cfg.bridge_token_ids)
    plan_log, schedule = [], engine.scheduler.schedule

    def logged():
        plan = schedule()
        plan_log.append({("comp" if r.is_companion else "main"): n for r, n in plan.items})
        return plan

    engine.scheduler.schedule = logged
    steps = []
    while engine.has_unfinished():
        steps += [o.extras["step"] for o in engine.step()]
    first_comp = next(i for i, p in enumerate(plan_log) if "comp" in p)
    # the 5 text steps (the first one is the prompt's prefill) and the bridge steps ran without it
    assert first_comp == 5 + n_bridge
    assert plan_log[first_comp] == {"main": 1, "comp": 1 + 5 + n_bridge}  # null prompt + skipped steps
    assert all(p.get("comp") == 1 for p in plan_log[first_comp + 1 :])
    assert comp.output_ids == req.output_ids
    assert steps == generate(lm, [5, 6, 7, 8], 5, 4, cfg_scale=3.0).steps.tolist()
