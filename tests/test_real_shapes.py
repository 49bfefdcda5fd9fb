"""The ``real`` presets: published shapes, counted at full depth; built at reduced depth on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.qwen3_tts.model import load_qwen3_tts
from omniduplex.models.random_init import MARKER, random_init_, random_seed
from omniduplex.models.real_shapes import (
    PUBLISHED_PARAMS,
    TOLERANCE,
    memory_budget_gib,
    parameter_counts,
    real_config,
    write_real_dir,
)
from omniduplex.models.registry import load_model


@pytest.mark.parametrize("key", sorted(PUBLISHED_PARAMS))
def test_full_depth_counts_match_the_published_totals(key):
    name, _, part = key.partition("/")
    counts = parameter_counts(name)
    ours = counts[part or "total"]
    tol = TOLERANCE.get(key, 0.005)
    assert abs(ours - PUBLISHED_PARAMS[key]) <= tol * PUBLISHED_PARAMS[key], (key, ours)


def test_published_widths_and_depth_cap():
    omni = real_config("qwen3-omni-30b-a3b")
    text = omni["thinker_config"]["text_config"]
    assert (text["num_hidden_layers"], text["num_experts"], text["num_experts_per_tok"]) == (48, 128, 8)
    assert omni["talker_config"]["accept_hidden_layer"] == 24
    small = real_config("qwen3-omni-30b-a3b", depth=2)
    assert small["thinker_config"]["text_config"]["num_hidden_layers"] == 2
    assert small["thinker_config"]["text_config"]["hidden_size"] == 2048  # same widths
    assert small["talker_config"]["accept_hidden_layer"] == 1  # a layer that exists
    assert small["code2wav_config"]["num_hidden_layers"] == 2
    # the layer count scales, the rest (embeddings, final norm) does not: 2 of 48 MoE layers
    per_layer = (parameter_counts("qwen3-omni-30b-a3b")["thinker-text"] - 2 * 152064 * 2048 - 2048) / 48
    got = parameter_counts("qwen3-omni-30b-a3b", depth=2)["thinker-text"] - 2 * 152064 * 2048 - 2048
    assert got == pytest.approx(2 * per_layer, rel=1e-9)
    with pytest.raises(ValueError, match="unknown real preset"):
        real_config("qwen3-omni-7b")
    with pytest.raises(ValueError, match="depth"):
        real_config("qwen3-0.6b", depth=0)


def test_memory_budget_says_bf16_fits_one_80gb_gpu():
    b = memory_budget_gib("qwen3-omni-30b-a3b")
    assert 60 < b["weights"] < 70  # 34.7B parameters × 2 bytes
    assert b["kv_bytes_per_token"] == 2 * 48 * 4 * 128 * 2
    assert b["weights"] + b["kv"] < 78  # an H100's usable memory, c=32 × 2048 cached tokens


def _engine_tokens(lm, n: int = 3) -> list[int]:
    from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    engine = Engine(DecoderLMAdapter(lm), num_blocks=8, max_num_seqs=1, dtype=torch.bfloat16)
    engine.add_request(
        Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    )
    out = []
    with torch.inference_mode():
        while engine.has_unfinished():
            out += [t for o in engine.step() for t in o.new_token_ids]
    return out


def test_text_lm_builds_at_reduced_depth_and_generates(tmp_path):
    d = write_real_dir(tmp_path / "q06", "qwen3-0.6b", depth=1, seed=3)
    assert not list(d.glob("*.safetensors")) and random_seed(d) == 3
    m = load_model(d, dtype=torch.bfloat16)
    lm = m.thinker
    assert lm.lm_head.weight.dtype == torch.bfloat16 and lm.lm_head.weight.shape == (151936, 1024)
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()  # tied, as published
    toks = _engine_tokens(lm)
    assert len(toks) == 3 and all(0 <= t < 151936 for t in toks)
    assert toks == _engine_tokens(load_model(d, dtype=torch.bfloat16).thinker)  # seeded: same weights


@pytest.mark.slow
def test_omni_builds_at_depth_one_and_each_stage_runs(tmp_path):
    d = write_real_dir(tmp_path / "omni", "qwen3-omni-30b-a3b", depth=1)
    m = load_model(d, parts=("thinker", "code2wav"), dtype=torch.bfloat16)
    assert m.thinker.model.layers[0].mlp.experts.gate_up_proj.shape == (128, 2 * 768, 2048)
    assert torch.isfinite(m.thinker.model.layers[0].mlp.experts.gate_up_proj.float().std())
    assert len(_engine_tokens(m.thinker, 2)) == 2
    with torch.inference_mode():
        wav = m.code2wav(torch.randint(0, 2048, (2, 16, 3)))
    assert wav.shape[:2] == (2, 1) and wav.shape[-1] > 0 and torch.isfinite(wav.float()).all()
    del m  # 2.5 GB of Thinker (its 152064-row tables) before the Talker
    enc = load_model(d, parts=("audio_tower",), dtype=torch.bfloat16).thinker  # the encoder stage's load
    assert enc.model is None and enc.lm_head is None and enc.audio_tower.proj2.weight.shape == (2048, 1280)
    del enc
    talker = load_model(d, parts=("talker",), dtype=torch.bfloat16).talker
    assert talker.codec_head.weight.shape == (3072, 1024)
    assert len(talker.model.layers[0].mlp.experts.down_proj) == 128


def test_tts_builds_at_depth_one_and_decodes(tmp_path):
    d = write_real_dir(tmp_path / "tts", "qwen3-tts-12hz-1.7b", depth=1)
    m = load_qwen3_tts(d, parts=("talker", "codec"), dtype=torch.bfloat16)
    assert m.talker.codec_head.weight.shape == (3072, 2048)
    with torch.inference_mode():
        wav = m.codec(torch.randint(0, 2048, (3, 16, 2)))
    assert wav.shape[:2] == (3, 1) and torch.isfinite(wav.float()).all() and wav.abs().max() > 0


def test_random_init_rules_and_bad_marker(tmp_path):
    lin = torch.nn.Sequential(torch.nn.Linear(400, 8), torch.nn.LayerNorm(8))
    assert random_init_(lin, seed=1) == 400 * 8 + 8 + 8 + 8
    assert lin[0].bias.abs().max() == 0 and (lin[1].weight == 1).all()
    assert lin[0].weight.std().item() == pytest.approx(1 / 20, rel=0.1)  # N(0, 1 / fan_in)
    (tmp_path / MARKER).write_text(json.dumps({"seed": "x"}))
    (tmp_path / "config.json").write_text(json.dumps(real_config("qwen3-0.6b", depth=1)))
    with pytest.raises((ValueError, CheckpointError), match="seed"):
        load_model(tmp_path)
