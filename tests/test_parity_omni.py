"""Parity of our Thinker, Talker + code predictor and full turn with ``transformers``' Qwen3-Omni.

Tiny random checkpoints written by ``init-model`` code, in several shapes (layers, GQA ratio,
MoE top-k, accept_hidden_layer) and seeds; fp32, greedy decoding.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache
from omniduplex.models.qwen3_omni.presets import omni_config, write_checkpoint
from omniduplex.models.qwen3_omni.reference import generate_turn
from omniduplex.models.registry import load_model
from omniduplex.models.tokenizer import load_tokenizer, voice_turn_prompt

transformers = pytest.importorskip("transformers")


def _variant(name: str) -> dict:
    cfg = omni_config("tiny")
    if name == "deep-gqa4":
        t = cfg["thinker_config"]["text_config"]
        t.update(num_hidden_layers=3, num_key_value_heads=1, num_experts=6, num_experts_per_tok=3)
        cfg["talker_config"]["accept_hidden_layer"] = 3  # == num layers: the normed output
        cfg["talker_config"]["text_config"].update(num_hidden_layers=3, num_key_value_heads=4)
        cfg["talker_config"]["code_predictor_config"]["num_hidden_layers"] = 3
    elif name == "mlp-only-layer":
        cfg["thinker_config"]["text_config"]["mlp_only_layers"] = [0]
        cfg["talker_config"]["accept_hidden_layer"] = 0  # the input embeddings
    return cfg


VARIANTS = [("tiny", 0), ("deep-gqa4", 1), ("mlp-only-layer", 2)]


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{v}-seed{s}" for v, s in VARIANTS])
def checkpoint(request, tmp_path_factory):
    name, seed = request.param
    d = tmp_path_factory.mktemp(f"ckpt-{name}")
    write_checkpoint(d, seed=seed, config=copy.deepcopy(_variant(name)))
    hf = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    return d, load_model(d), hf


def _speechlike(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f0 = 120 + 30 * np.sin(2 * np.pi * 3 * t)
    voiced = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / 16000) / k for k in range(1, 6))
    return (
        0.3 * voiced * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)) + 0.01 * rng.standard_normal(t.shape)
    ).astype(np.float32)


def _inputs(d, ours, seconds=1.3, seed=0):
    fe = transformers.WhisperFeatureExtractor.from_pretrained(d)
    feats = fe(
        _speechlike(seconds, seed),
        sampling_rate=16000,
        return_attention_mask=True,
        return_tensors="pt",
        padding=False,
        truncation=False,
    )
    frames = int(feats["attention_mask"].sum())
    from omniduplex.models.qwen3_omni.audio_encoder import audio_token_count

    n_audio = int(audio_token_count(torch.tensor([frames]))[0])
    ids = voice_turn_prompt(ours.config, load_tokenizer(d), n_audio)
    return ids, feats["input_features"][0, :, :frames], feats


def test_thinker_prefill_logits_match(checkpoint):
    d, ours, hf = checkpoint
    ids, features, feats = _inputs(d, ours)
    with torch.no_grad():
        ref = hf.thinker(
            input_ids=torch.tensor([ids]),
            input_features=feats["input_features"],
            feature_attention_mask=feats["attention_mask"],
        ).logits[0]
        audio, _ = ours.thinker.audio_tower(features[None], torch.tensor([features.shape[-1]]))
        x = ours.thinker.embed(torch.tensor(ids), audio)
        kv = allocate_kv_cache(
            ours.thinker.cfg.num_hidden_layers,
            16,
            ours.thinker.cfg.num_key_value_heads,
            ours.thinker.cfg.head_dim,
        )
        hidden, _ = ours.thinker(x, ForwardBatch.contiguous([len(ids)], [0]), kv)
        got = ours.thinker.compute_logits(hidden)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_full_turn_matches_transformers_generate(checkpoint):
    d, ours, hf = checkpoint
    ids, features, feats = _inputs(d, ours, seconds=1.7, seed=1)
    captured = {}
    decode = hf.code2wav.chunked_decode

    def spy(codes, **kw):
        captured["codes"] = codes.clone()
        return decode(codes, **kw)

    hf.code2wav.chunked_decode = spy
    with torch.no_grad():
        seq, wav = hf.generate(
            input_ids=torch.tensor([ids]),
            input_features=feats["input_features"],
            feature_attention_mask=feats["attention_mask"],
            return_audio=True,
            thinker_max_new_tokens=12,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=20,
            speaker="Ethan",
            thinker_eos_token_id=ours.config.im_end_token_id,
        )
    out = generate_turn(ours, ids, features, max_new_tokens=12, talker_max_new_tokens=20)
    assert out.thinker_token_ids == seq[0, len(ids) :].tolist()
    ref_codes = captured["codes"][0].T.tolist()  # [frames][groups]
    assert len(ref_codes) > 0
    assert out.talker_codes == ref_codes
    ref_wav = wav.reshape(-1)
    assert out.waveform.shape == ref_wav.shape
    scale = ref_wav.abs().max().clamp_min(1e-6)
    assert float((out.waveform - ref_wav).abs().max() / scale) <= 1e-4
