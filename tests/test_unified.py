"""Unified delay-pattern LM: config, presets, loading, embeddings, stream logits, sequential reference."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from omniduplex.cli.main import cli
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.config import ConfigError
from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache
from omniduplex.models.registry import load_model
from omniduplex.models.unified.delay_pattern import interleave
from omniduplex.models.unified.model import UnifiedConfig, text_steps
from omniduplex.models.unified.phases import AUDIO, DRAIN, TEXT, TRANSITION
from omniduplex.models.unified.presets import unified_config, write_unified_checkpoint
from omniduplex.models.unified.reference import generate

PROMPT = [257, 72, 105, 33, 10]  # <|im_start|> "Hi!\n"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matmuls: intra-op threading only adds barrier waits (very slow on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_unified_checkpoint(tmp_path_factory.mktemp("unified"), "tiny", seed=0)


@pytest.fixture(scope="module")
def loaded(ckpt):
    return load_model(ckpt)


@pytest.fixture()
def lm(loaded):
    return copy.deepcopy(loaded.unified)


def _scale_rows(lm, ids, factor):
    with torch.no_grad():
        lm.lm_head.weight[ids] *= factor


def _text_first(lm):
    """Shrink every row that could start the transition (audio regions, speech start, bridge) by 10×.

    A positive scale keeps the order of the logits inside each audio region (so audio codes and CFG
    still vary) but makes TEXT argmaxes land in the text region: speech then starts only through the
    ``max_text_tokens`` budget, deterministically.
    """
    cfg = lm.cfg
    rows = list(range(cfg.text_vocab_size, cfg.vocab_size)) + [
        cfg.speech_start_token_id,
        *cfg.bridge_token_ids,
    ]
    _scale_rows(lm, rows, 0.1)
    _scale_rows(lm, [cfg.eos_token_id], 0.0)
    return lm


def test_config_round_trip_and_errors():
    d = unified_config("tiny")
    cfg = UnifiedConfig.from_dict(d)
    assert UnifiedConfig.from_dict(cfg.to_dict()) == cfg
    assert d["architectures"] == ["OmniduplexUnifiedLM"] and d["model_type"] == "omniduplex_unified"
    assert (
        cfg.vocab_size == 288 + 4 * 66
        and cfg.audio_eos_id(0) == 288 + 65
        and cfg.audio_pad_id(3) == 288 + 3 * 66 + 64
    )
    for bad, match in [
        (dict(vocab_size=999), "vocab_size=999"),
        (dict(audio_vocab_size=65), "pad and eos"),
        (dict(eos_token_id=400), "outside the text region"),
        (dict(bridge_token_ids=[]), "at least one"),
    ]:
        with pytest.raises(ConfigError, match=match):
            UnifiedConfig.from_dict({**d, **bad})


def test_preset_is_deterministic_and_cli_writes_it(tmp_path, ckpt):
    again = write_unified_checkpoint(tmp_path / "again", "tiny", seed=0)
    for f in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / f).read_bytes() == (ckpt / f).read_bytes(), f
    other = write_unified_checkpoint(tmp_path / "other", "tiny", seed=1)
    assert (other / "model.safetensors").read_bytes() != (ckpt / "model.safetensors").read_bytes()
    res = CliRunner().invoke(
        cli, ["init-model", "--arch", "unified", "--preset", "tiny", "--out", str(tmp_path / "c")]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["architecture"] == "OmniduplexUnifiedLM"
    assert (tmp_path / "c" / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()


def test_tensor_names_and_loader(tmp_path, ckpt, loaded):
    names = set(load_file(str(ckpt / "model.safetensors")))
    for n in (
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.q_norm.weight",
        "model.norm.weight",
        "stream_embeddings",
        "lm_head.weight",
        "codec.quantizer.quantizers.3.codebook.weight",
        "codec.decoder.block.0.conv_t1.weight",
        "codec.decoder.conv2.weight",
    ):
        assert n in names, n
    assert loaded.unified.stream_embeddings.shape == (4, 64) and loaded.codec is not None
    assert set(loaded.num_parameters()) == {"unified", "codec", "codec_encoder"}
    only_lm = load_model(ckpt, parts=("thinker",))
    assert only_lm.codec is None and only_lm.unified is not None
    # encoder tensors (as a full DacModel saves them) are ignored; unknown LM tensors are not
    tensors = load_file(str(ckpt / "model.safetensors"))
    (tmp_path / "config.json").write_text((ckpt / "config.json").read_text())
    tensors["codec.encoder.conv1.weight"] = torch.zeros(4, 1, 7)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert load_model(tmp_path).codec is not None
    tensors["model.layers.9.mlp.up_proj.weight"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.layers.9.mlp.up_proj.weight"):
        load_model(tmp_path)


def test_embed_step_sums_present_tokens(lm):
    e = lm.model.embed_tokens.weight
    cfg = lm.cfg
    codes = [cfg.stream_offset(i) + 3 * i for i in range(4)]
    tokens = torch.tensor(
        [[104, -1, -1, -1], codes, [cfg.audio_pad_id(0), codes[1], -1, cfg.audio_pad_id(3)]]
    )
    x = lm.embed_step(tokens)
    torch.testing.assert_close(x[0], e[104])
    torch.testing.assert_close(x[1], e[codes].sum(0))
    torch.testing.assert_close(x[2], e[cfg.audio_pad_id(0)] + e[codes[1]] + e[cfg.audio_pad_id(3)])
    assert torch.equal(text_steps([5, 6], 4), torch.tensor([[5, -1, -1, -1], [6, -1, -1, -1]]))


def test_stream_logits_equal_per_stream_head(lm):
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    out = lm.stream_logits(h)
    assert out.shape == (3, 4, lm.cfg.vocab_size)
    for i in range(4):
        torch.testing.assert_close(out[:, i], lm.lm_head(h + lm.stream_embeddings[i]))
    torch.testing.assert_close(lm.stream_logits(h, [2, 0]), out[:, [2, 0]])


@torch.no_grad()
def test_prefill_equals_incremental_paged_decode(lm):
    steps = torch.cat(
        [text_steps(PROMPT, 4), torch.tensor([[lm.cfg.stream_offset(i) + i for i in range(4)]])]
    )
    c = lm.cfg.decoder
    kv = allocate_kv_cache(c.num_hidden_layers, 2, c.num_key_value_heads, c.head_dim)
    full = lm(lm.embed_step(steps), ForwardBatch.contiguous([len(steps)], [0]), kv)
    kv = allocate_kv_cache(c.num_hidden_layers, 2, c.num_key_value_heads, c.head_dim)
    inc = [
        lm(lm.embed_step(steps[t : t + 1]), ForwardBatch.contiguous([1], [t]), kv) for t in range(len(steps))
    ]
    torch.testing.assert_close(torch.cat(inc), full, atol=1e-5, rtol=1e-5)


def _check_turn(out, cfg, n_text, frames):
    s = cfg.num_streams
    nb = len(cfg.bridge_token_ids)
    assert out.phases == [TEXT] * n_text + [TRANSITION] * nb + [AUDIO] * frames + [DRAIN] * (s - 1)
    assert len(out.text_ids) == n_text
    assert out.codes.shape == (s, frames)
    assert ((out.codes >= 0) & (out.codes < cfg.codebook_size)).all()
    assert out.steps[n_text : n_text + nb, 0].tolist() == cfg.bridge_token_ids
    # the audio+drain steps are exactly the delay-interleaved codes (EOS on stream 0 at drain step 0)
    offsets = torch.tensor([cfg.stream_offset(i) for i in range(s)])
    want = interleave(out.codes + offsets[:, None], [cfg.audio_pad_id(i) for i in range(s)])
    want[0, frames] = cfg.audio_eos_id(0)
    assert torch.equal(out.steps[n_text + nb :].T, want)


@torch.no_grad()
def test_reference_speaks_after_the_text_budget_and_cfg_touches_audio_only(lm):
    lm = _text_first(lm)
    cfg = lm.cfg
    plain = generate(lm, PROMPT, max_text_tokens=5, max_audio_frames=6)
    _check_turn(plain, cfg, 5, 6)
    assert all(t < cfg.text_vocab_size for t in plain.text_ids)
    guided = generate(lm, PROMPT, max_text_tokens=5, max_audio_frames=6, cfg_scale=3.0)
    _check_turn(guided, cfg, 5, 6)
    assert guided.text_ids == plain.text_ids  # CFG is off in TEXT
    assert not torch.equal(guided.codes, plain.codes)  # and on in AUDIO/DRAIN
    assert generate(lm, PROMPT, 5, 6, cfg_scale=1.0).steps.tolist() == plain.steps.tolist()


@torch.no_grad()
def test_reference_follows_the_models_own_decisions(lm):
    cfg = lm.cfg
    # speech-start row boosted: the model decides to speak at once (no budget involved)
    boosted = copy.deepcopy(lm)
    _scale_rows(boosted, [cfg.speech_start_token_id], 50.0)
    out = generate(boosted, PROMPT, max_text_tokens=10, max_audio_frames=4)
    _check_turn(out, cfg, 0, 4)
    # audio-EOS row boosted: it is also an audio-region argmax in TEXT, and ends the clip at once
    eos = copy.deepcopy(lm)
    _scale_rows(eos, [cfg.audio_eos_id(0)], 50.0)
    out = generate(eos, PROMPT, max_text_tokens=10, max_audio_frames=4)
    _check_turn(out, cfg, 0, 0)
    # text-EOS row boosted: the turn ends in text, no audio
    _scale_rows(lm, [cfg.eos_token_id], 50.0)
    out = generate(lm, PROMPT, max_text_tokens=10, max_audio_frames=4)
    assert out.phases == [TEXT] and out.text_ids == [cfg.eos_token_id] and out.codes.shape == (4, 0)


@torch.no_grad()
def test_sampling_is_seeded_and_codes_decode(lm, loaded):
    lm = _text_first(lm)
    a = generate(lm, PROMPT, 3, 5, greedy=False, generator=torch.Generator().manual_seed(7))
    b = generate(lm, PROMPT, 3, 5, greedy=False, generator=torch.Generator().manual_seed(7))
    assert a.steps.tolist() == b.steps.tolist()
    _check_turn(a, lm.cfg, 3, 5)
    wav = loaded.codec.decode(a.codes[None])
    assert wav.shape == (1, 1, 5 * loaded.codec.hop_length) and 0 < wav.abs().max() < 1


def test_decode_logits_equal_stream_logits_where_sampled(lm):
    h = torch.randn(5, lm.cfg.decoder.hidden_size)
    full = lm.stream_logits(h).float()
    primary, aux = lm.decode_logits(h)
    torch.testing.assert_close(primary, full[:, 0])
    a = lm.cfg.audio_vocab_size
    for i in range(1, lm.cfg.num_streams):
        lo = lm.cfg.stream_offset(i)
        torch.testing.assert_close(aux[:, i - 1], full[:, i, lo:lo + a], rtol=1e-5, atol=1e-5)
