"""Higgs Audio v3 on our engine: the slot-table decode state (the lever) equals the per-request loop; a
request batched with others (joining at different steps, shrinking batches, preemption, prefix-cache hits, a
reused slot) equals it alone; the rules' tensor form equals their plain-Python form; clear errors for bad
input while another request finishes unaffected; a checkpoint missing a tensor names it; ``synthesize`` and
``init-model``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from omniduplex.cli.main import cli
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.higgs.config import HiggsConfig
from omniduplex.models.higgs.model import load_higgs
from omniduplex.models.higgs.presets import higgs_config, write_higgs_checkpoint
from omniduplex.models.higgs.prompt import PromptError, check_reference_audio, delayed_reference
from omniduplex.models.higgs.rules import RULES, advance, forced, step_one
from omniduplex.models.unified.delay_pattern import deinterleave
from omniduplex.pipeline.engine.sampler import SamplingBatch, sample_inverse_cdf
from omniduplex.pipeline.speech.higgs import HiggsEngine, synthesize
from omniduplex.pipeline.stages.engine_build import EngineSettings

GREEDY = {"temperature": 0.0, "max_tokens": 36}
SAMPLED = {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "max_tokens": 30, "seed": 7}
WORK = [  # (id, text, voice, sampling, step at which it joins)
    ("a", "Hello there, how are you?", None, GREEDY, 0),
    ("b", "One two three four five.", "belinda", GREEDY, 0),
    ("c", "A sampled request with its own seed.", "en_man", SAMPLED, 3),
    ("d", "Short.", None, {**SAMPLED, "seed": 11, "temperature": 1.2}, 7),
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: two collapse on a shared 2-core host; results do not change."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_higgs(write_higgs_checkpoint(tmp_path_factory.mktemp("higgs") / "tiny", "tiny", 0))


def run(engine: HiggsEngine, work, abort_at: dict | None = None):
    """Add each request at its step, step to the end; ``{id: (frames [F, N], reason)}``."""
    frames, reasons, step = {}, {}, 0
    pending = list(work)
    while pending or engine.has_unfinished():
        for rid, text, voice, sp, at in [w for w in pending if w[4] <= step]:
            engine.add(rid, engine.prompt(text, voice), sp)
            pending.remove((rid, text, voice, sp, at))
        for rid, when in (abort_at or {}).items():
            if when == step:
                assert engine.abort(rid)
                reasons[rid] = "abort"
        for ev in engine.step():
            frames.setdefault(ev.request_id, [])
            if ev.codes is not None:
                frames[ev.request_id].append(ev.codes)
            if ev.finished:
                reasons[ev.request_id] = ev.finish_reason
        step += 1
    return {
        k: (torch.stack(v) if v else torch.zeros(0, 8, dtype=torch.long), reasons[k])
        for k, v in frames.items()
    }


def alone(model, rules="v3"):
    out = {}
    for w in WORK:
        out.update(run(HiggsEngine(model, rules=rules, engine=EngineSettings(num_blocks=64)), [(*w[:4], 0)]))
    return out


def same(x, y):
    assert set(x) == set(y)
    for k in x:
        assert x[k][1] == y[k][1], k
        assert torch.equal(x[k][0], y[k][0]), k


@pytest.mark.parametrize("rules", ["v3", "transformers"])
def test_batched_equals_alone_and_lever_off(model, rules):
    ref = alone(model, rules)
    assert {r for _, r in ref.values()} >= {"stop", "length"} or rules == "transformers"
    on = HiggsEngine(model, rules=rules, lever=True, engine=EngineSettings(num_blocks=64))
    same(run(on, WORK), ref)
    off = HiggsEngine(model, rules=rules, lever=False, engine=EngineSettings(num_blocks=64))
    same(run(off, WORK), ref)
    assert on.adapter.decode_steps > 0 and on.adapter.state_seconds > 0


def test_preemption_prefix_cache_and_slot_reuse(model):
    ref = alone(model)
    # 14 blocks cannot hold four requests to the end: the youngest are preempted and recomputed from their
    # slot rows
    tight = HiggsEngine(model, engine=EngineSettings(num_blocks=14, max_num_seqs=4))
    same(run(tight, WORK), ref)
    prompt_rows = sum(len(tight.prompt(t, v)) for _, t, v, _, _ in WORK)
    assert tight.engine.num_prefill_tokens > prompt_rows  # recomputed rows: preemption happened
    # the same voice twice: the second prompt's voice rows come from the prefix cache, codes unchanged
    cached = HiggsEngine(model, engine=EngineSettings(num_blocks=64))
    got = run(cached, [WORK[1]])
    again = run(cached, [("b2", *WORK[1][1:4], 0)])
    assert cached.engine.num_cached_tokens > 0
    assert torch.equal(got["b"][0], ref["b"][0]) and torch.equal(again["b2"][0], ref["b"][0])
    # an aborted request frees its slot; the next request takes it over with a clean state
    eng = HiggsEngine(model, engine=EngineSettings(num_blocks=64, max_num_seqs=2))
    res = run(eng, [WORK[0], WORK[2], (*WORK[1][:4], 9)], abort_at={"a": 5})
    assert res["a"][1] == "abort"
    same({k: res[k] for k in ("b", "c")}, {k: ref[k] for k in ("b", "c")})


@pytest.mark.parametrize("rules", sorted(RULES))
def test_rule_tensors_equal_plain_python(rules):
    r, n, boc, eoc = RULES[rules], 8, 1024, 1025
    g = torch.Generator().manual_seed(0)
    b = 512
    steps = torch.randint(0, 20, (b,), generator=g)
    state = torch.randint(-1, 9, (b,), generator=g)
    drawn = torch.randint(1018, 1026, (b, n), generator=g)  # BOC and EOC come up often
    drawn[::7] = eoc  # some all-EOC frames
    bf, ef = forced(r, steps, state, n)
    codes = torch.where(bf, boc, torch.where(ef, eoc, drawn))
    new, ended, emits = advance(r, codes, steps, state, eoc)
    for i in range(b):
        c, s1, e1, m1 = step_one(r, drawn[i].tolist(), int(steps[i]), int(state[i]), boc, eoc)
        assert (c, s1, e1, m1) == (codes[i].tolist(), int(new[i]), bool(ended[i]), bool(emits[i])), i
    assert ended.any() and (~ended).any() and emits.any() and (~emits).any()


def test_inverse_cdf_sampler_distribution():
    """One uniform per row through the CDF samples softmax(logits / T) after top-k; greedy rows argmax."""
    v, rows = 6, 60000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]).repeat(rows, 1)
    t = torch.full((rows,), 0.8)
    sb = SamplingBatch(
        t,
        torch.zeros(rows, dtype=torch.long),
        torch.ones(rows),
        torch.ones(rows),
        torch.full((rows,), 3, dtype=torch.long),
        torch.arange(rows),
    )
    freq = torch.bincount(sample_inverse_cdf(logits, sb), minlength=v).double() / rows
    assert torch.allclose(freq, torch.softmax(logits[0] / 0.8, -1).double(), atol=0.006)
    sb.top_k = torch.full((rows,), 2, dtype=torch.long)
    assert set(sample_inverse_cdf(logits, sb).unique().tolist()) == {0, 1}
    sb.temperature = torch.zeros(rows)
    assert (
        sample_inverse_cdf(
            logits[:5],
            SamplingBatch(
                *(
                    x[:5]
                    for x in (
                        sb.temperature,
                        sb.top_k,
                        sb.top_p,
                        sb.repetition_penalty,
                        sb.seeds,
                        sb.counters,
                    )
                )
            ),
        )
        .eq(0)
        .all()
    )


def test_delayed_reference_layout():
    cfg = HiggsConfig.from_dict(higgs_config("tiny"))
    codes = torch.randint(0, 1024, (5, 8))
    rows = delayed_reference(codes, cfg)
    assert rows.shape == (5 + 7, 8)
    assert torch.equal(deinterleave(rows.T).T, codes)
    for i in range(8):  # codebook i: i BOCs, its 5 codes, then EOCs
        assert rows[:i, i].eq(cfg.boc_id).all() and rows[i + 5 :, i].eq(cfg.eoc_id).all()


def test_bad_input_clear_errors_others_unaffected(model):
    ref = alone(model)
    eng = HiggsEngine(model, engine=EngineSettings(num_blocks=16))  # 256 rows of context
    eng.add("a", eng.prompt("Hello there, how are you?"), GREEDY)
    eng.step()
    cfg = model.config
    with pytest.raises(PromptError, match="unknown voice 'nobody'.*belinda"):
        eng.prompt("hi", "nobody")
    with pytest.raises(PromptError, match=r"must be \[T >= 1, 8\]"):
        eng.prompt("hi", ref_codes=torch.zeros(4, 7, dtype=torch.long))
    with pytest.raises(PromptError, match=r"ids must be integers in \[0, 1024\)"):
        eng.prompt("hi", ref_codes=torch.full((4, 8), 1024))
    with pytest.raises(PromptError, match="not both"):
        eng.prompt("hi", "belinda", ref_codes=torch.zeros(4, 8, dtype=torch.long))
    with pytest.raises(PromptError, match="empty"):
        eng.prompt("   ")
    with pytest.raises(PromptError, match="text past the context"):
        eng.prompt("word " * 80)
    with pytest.raises(PromptError, match="text past the context"):
        eng.add("long", eng.prompt("Hi."), {"max_tokens": 400})
    with pytest.raises(PromptError, match="must be 24000 Hz, got 16000"):
        check_reference_audio(torch.zeros(32000), 16000, cfg)
    with pytest.raises(PromptError, match="at least 1.0 s"):
        check_reference_audio(torch.zeros(12000), 24000, cfg)
    with pytest.raises(PromptError, match="encoder"):
        check_reference_audio(torch.zeros(48000), 24000, cfg)
    with pytest.raises(ValueError, match="duplicate|already"):
        eng.add("a", eng.prompt("again"), GREEDY)
    with pytest.raises(ValueError, match="invalid sampling|top_p"):
        eng.add("bad", eng.prompt("x"), {"top_p": 0.0})
    with pytest.raises(ValueError, match="max_steps"):
        eng.add("huge", eng.prompt("x"), {"max_tokens": 5000})
    with pytest.raises(TypeError, match="HiggsPrompt"):
        eng.add("raw", [1, 2, 3], GREEDY)
    # cloning from caller codes works beside it
    eng.add(
        "clone", eng.prompt("Cloned.", ref_codes=model.voices["belinda"].codes, ref_text="transcript"), GREEDY
    )
    frames = {}
    while eng.has_unfinished():
        for ev in eng.step():
            if ev.codes is not None:
                frames.setdefault(ev.request_id, []).append(ev.codes)
    assert torch.equal(torch.stack(frames["a"][:]), ref["a"][0][: len(frames["a"])])
    assert len(frames["a"]) == ref["a"][0].shape[0] and frames["clone"]


def test_missing_tensor_named(tmp_path):
    path = write_higgs_checkpoint(tmp_path / "m", "tiny", 0)
    w = load_file(str(path / "model.safetensors"))
    del w["body.layers.1.self_attn.k_norm.weight"]
    save_file(w, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="body.layers.1.self_attn.k_norm.weight"):
        load_higgs(path)
    path = write_higgs_checkpoint(tmp_path / "c", "tiny", 0)
    w = load_file(str(path / "audio_tokenizer" / "model.safetensors"))
    del w["acoustic_decoder.block.2.conv_t1.weight"]
    save_file(w, str(path / "audio_tokenizer" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="acoustic_decoder.block.2.conv_t1.weight"):
        load_higgs(path)
    load_higgs(path, parts=("talker",))  # the talker alone still loads


def test_synthesize_streamed_equals_one_shot(model):
    pcm, sr = synthesize(model, "Hello there, how are you?", "belinda", GREEDY)
    engine = HiggsEngine(model, engine=EngineSettings(num_blocks=64))
    frames = run(engine, [("x", "Hello there, how are you?", "belinda", GREEDY, 0)])["x"][0]
    assert sr == 24000 and pcm.shape == (frames.shape[0] * 960,)
    whole = model.codec.decode(frames.T[None]).reshape(-1)
    assert float((pcm - whole).abs().max()) < 1e-5 and float(whole.abs().max()) > 0.05


def test_init_model_cli(tmp_path):
    res = CliRunner().invoke(cli, ["init-model", "--arch", "higgs-tiny", "--out", str(tmp_path / "h")])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output.strip().splitlines()[-1])
    assert info["architecture"] == "HiggsMultimodalQwen3ForConditionalGeneration" and info["preset"] == "tiny"
    assert load_higgs(tmp_path / "h").voices.keys() == {"belinda", "en_man"}
