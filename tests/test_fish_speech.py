"""Fish Speech S2 Pro: the published config, the preset checkpoints and their loading, greedy codes and logits
against an independent float64 reference of the published Dual-AR math (``tests/fish_speech_reference.py``),
and the 44.1 kHz waveform against ``transformers``' ``DacModel``."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from fish_speech_reference import FishReference
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import DacConfig, DacModel

from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.config import ConfigError
from omniduplex.models.fish_speech.config import FishConfig
from omniduplex.models.fish_speech.load import is_fish_speech, load_fish_speech
from omniduplex.models.fish_speech.presets import write_fish_checkpoint
from omniduplex.models.fish_speech.prompt import FishVoice
from omniduplex.models.forward_batch import SequenceCache
from omniduplex.pipeline.speech.fish_speech import FishSpeechEngine, FishStreamDecoder

# fishaudio/s2-pro config.json (the values its model card's config holds)
S2_PRO = {
    "model_type": "fish_qwen3_omni",
    "eos_token_id": 151645,
    "pad_token_id": 151669,
    "audio_pad_token_id": 151677,
    "semantic_start_token_id": 151678,
    "semantic_end_token_id": 155773,
    "dtype": "bfloat16",
    "text_config": {
        "model_type": "fish_qwen3",
        "vocab_size": 155776,
        "n_layer": 36,
        "n_head": 32,
        "n_local_heads": 8,
        "head_dim": 128,
        "dim": 2560,
        "intermediate_size": 9728,
        "rope_base": 1000000,
        "norm_eps": 1e-06,
        "max_seq_len": 32768,
        "tie_word_embeddings": True,
        "attention_qkv_bias": False,
        "attention_o_bias": False,
        "attention_qk_norm": True,
    },
    "audio_decoder_config": {
        "model_type": "fish_qwen3_audio_decoder",
        "vocab_size": 4096,
        "num_codebooks": 10,
        "n_layer": 4,
        "n_head": 32,
        "n_local_heads": 8,
        "head_dim": 128,
        "dim": 2560,
        "intermediate_size": 9728,
        "max_seq_len": 11,
        "text_dim": 2560,
        "rope_base": 1000000,
        "norm_eps": 1e-06,
        "attention_qk_norm": False,
    },
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fish")
    return {p: write_fish_checkpoint(root / p, p) for p in ("tiny", "deep")}


def _greedy(engine: FishSpeechEngine, prompt, max_tokens: int) -> list[list[int]]:
    engine.add("r", prompt, {"temperature": 0, "max_tokens": max_tokens})
    frames = []
    while engine.has_unfinished():
        frames += [ev.codes.tolist() for ev in engine.step() if ev.codes is not None]
    return frames


def test_published_config():
    cfg = FishConfig.from_dict(S2_PRO)
    s, f = cfg.slow, cfg.fast
    assert (s.num_hidden_layers, s.hidden_size, s.num_attention_heads, s.num_key_value_heads) == (
        36,
        2560,
        32,
        8,
    )
    assert s.head_dim == 128 and s.qk_norm and s.tie_word_embeddings and s.rope_theta == 1e6
    assert (f.num_hidden_layers, f.hidden_size, f.head_dim, f.vocab_size) == (4, 2560, 128, 4096)
    assert not f.qk_norm and not f.tie_word_embeddings and f.rope_theta == 1e6
    assert (cfg.num_codebooks, cfg.codebook_size, cfg.im_end_id, cfg.max_seq_len) == (10, 4096, 151645, 32768)
    bad = json.loads(json.dumps(S2_PRO))
    bad["semantic_end_token_id"] = 155770
    with pytest.raises(ConfigError, match="semantic tokens 151678..155770 are 4093 ids"):
        FishConfig.from_dict(bad)
    del bad["text_config"]["n_head"]
    with pytest.raises(ConfigError, match="n_head"):
        FishConfig.from_dict(bad)
    with pytest.raises(ConfigError, match="model_type"):
        FishConfig.from_dict({**S2_PRO, "model_type": "dual_ar"})


def test_preset_deterministic_tokenizer_and_cli(ckpts, tmp_path):
    again = write_fish_checkpoint(tmp_path / "again", "tiny")
    for name in ("model.safetensors", "codec/model.safetensors", "config.json", "tokenizer.json"):
        assert (again / name).read_bytes() == (ckpts["tiny"] / name).read_bytes()
    cfg = json.loads((again / "config.json").read_text())
    tok = Tokenizer.from_file(str(again / "tokenizer.json"))
    assert tok.token_to_id("<|semantic:0|>") == cfg["semantic_start_token_id"]
    assert tok.token_to_id("<|im_end|>") == cfg["eos_token_id"]
    assert is_fish_speech(again) and not is_fish_speech(tmp_path)
    from typer.testing import CliRunner

    from omniduplex.cli.main import cli

    res = CliRunner().invoke(
        cli, ["init-model", "--arch", "fish-speech-tiny", "--out", str(tmp_path / "cli")]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["architecture"] == "fish_qwen3_omni"
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()


@pytest.mark.parametrize("preset", ["tiny", "deep"])
@pytest.mark.parametrize("cloned", [False, True], ids=["default", "cloned"])
def test_greedy_codes_match_reference(ckpts, preset, cloned):
    d = ckpts[preset]
    model = load_fish_speech(d, parts=("lm",))
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    ref = FishReference(d)
    codes = torch.randint(0, model.config.codebook_size, (10, 9), generator=torch.Generator().manual_seed(3))
    voice = FishVoice("ref", codes, "The reference words.") if cloned else None
    engine = FishSpeechEngine(model, tok)
    text = "Hello there, how are you today?"
    prompt = engine.prompt(text, voice)
    ref_ids = ref.prompt_ids(tok, text, (codes, voice.transcript) if cloned else None)
    assert prompt.ids == ref_ids
    first = ref_ids.index(tok.token_to_id("<|audio_start|>")) + 1 if cloned else -1
    expected = ref.generate(ref_ids, codes if cloned else None, first, max_new_tokens=14)
    assert len(expected) == 13 and len({tuple(f) for f in expected}) > 5  # varied frames, not a constant
    assert _greedy(engine, prompt, 14) == expected


@pytest.mark.parametrize("preset", ["tiny", "deep"])
def test_logits_match_reference(ckpts, preset):
    """Slow-AR prefill logits (over the samplable ids) and the fast AR's first logits, fp32 vs float64."""
    d = ckpts[preset]
    lm = load_fish_speech(d, parts=("lm",)).lm
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    ref = FishReference(d)
    ids = ref.prompt_ids(tok, "Checking the logits.")
    cache = SequenceCache(lm.cfg.slow, len(ids))
    hidden = lm(lm.input_rows(torch.tensor(ids)), cache.batch(len(ids)), cache.kv)[-1:]
    ours = lm.compute_logits(hidden)[0].double()
    h = ref.slow.forward(torch.stack(ref.prompt_rows(ids, None, -1)))[-1]
    full = ref.token_logits(h)
    c = lm.cfg
    expected = torch.cat(
        (full[c.semantic_begin_id : c.semantic_end_id + 1], full[c.im_end_id : c.im_end_id + 1])
    )
    assert torch.allclose(ours, expected, atol=2e-5, rtol=1e-5), (ours - expected).abs().max()
    c0 = int(expected[:-1].argmax())
    emb = lm.code0_embedding(torch.tensor([c0]))
    x = lm.code_predictor._first_rows(hidden, emb)
    cos, sin = lm.code_predictor.model.rotary(torch.arange(2))
    out = lm.code_predictor._step(x, 0, cos, sin, [None] * len(lm.code_predictor.model.layers))
    fast = lm.code_predictor.head(1)(out[:, -1])[0].double()
    assert torch.allclose(fast, ref.fast_logits(h, c0), atol=2e-5, rtol=1e-5)


def test_missing_or_unexpected_tensor_is_named(ckpts, tmp_path):
    d = write_fish_checkpoint(tmp_path / "broken", "tiny")
    tensors = load_file(str(d / "model.safetensors"))
    name = "audio_decoder.layers.2.attention.wqkv.weight"
    shape = list(tensors.pop(name).shape)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=re.escape(f"missing tensor '{name}' (expected shape {shape})")):
        load_fish_speech(d, parts=("lm",))
    tensors[name] = torch.zeros(shape)
    tensors["text_model.model.layers.9.ffn_norm.weight"] = torch.ones(64)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="'text_model.model.layers.9.ffn_norm.weight' is not part of"):
        load_fish_speech(d, parts=("lm",))
    codec = load_file(str(d / "codec" / "model.safetensors"))
    codec.pop("decoder.conv2.weight")
    save_file(codec, str(d / "codec" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensor 'decoder.conv2.weight'"):
        load_fish_speech(d, parts=("codec",))


def _int16(x) -> np.ndarray:
    return np.clip(np.round(np.asarray(x, dtype=np.float64) * 32768), -32768, 32767).astype(np.int64)


def test_waveform_within_one_lsb_of_transformers_dac_and_streamed_equals_one_shot(ckpts):
    d = ckpts["tiny"]
    model = load_fish_speech(d)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    engine = FishSpeechEngine(model, tok)
    frames = torch.tensor(_greedy(engine, engine.prompt("Hi!"), 12))
    dac = DacModel(DacConfig(**json.loads((d / "codec" / "config.json").read_text()))).eval()
    dac.load_state_dict(load_file(str(d / "codec" / "model.safetensors")), strict=True)
    with torch.no_grad():
        expected = dac.decode(audio_codes=frames.t()[None]).audio_values.reshape(-1)
        one_shot = model.codec.decode(frames.t()[None]).reshape(-1)
    for sizes in ([1], [3, 1, 4], [len(frames)]):
        dec, pieces, at, i = FishStreamDecoder(model.codec), [], 0, 0
        while at < len(frames):
            pieces.append(dec.feed(frames[at : at + sizes[i % len(sizes)]]))
            at, i = at + sizes[i % len(sizes)], i + 1
        streamed = torch.cat([*pieces, dec.flush()])
        assert streamed.shape == expected.shape == (len(frames) * 2048,)
        assert np.abs(_int16(streamed) - _int16(expected)).max() <= 1
        assert np.abs(_int16(streamed) - _int16(one_shot)).max() <= 1
    assert float(expected.abs().max()) > 1e-3  # not silence
