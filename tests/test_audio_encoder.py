"""AudioEncoder against transformers' Qwen3OmniMoeAudioEncoder on tiny random configs (fp32)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    _get_feat_extract_output_lengths,
)

from omniduplex.models.qwen3_omni.audio_encoder import AudioEncoder, AudioEncoderConfig, audio_token_count

# n_window stays in 49..52: the reference hard-codes 13 tokens per chunk and breaks elsewhere.
CONFIGS = [
    dict(seed=0, d_model=32, encoder_ffn_dim=64, downsample_hidden_size=16, n_window=50, n_window_infer=200),
    dict(seed=1, d_model=64, encoder_ffn_dim=96, downsample_hidden_size=32, n_window=52, n_window_infer=104),
    dict(seed=2, d_model=48, encoder_ffn_dim=80, downsample_hidden_size=24, n_window=49, n_window_infer=400,
         activation_function="gelu_pytorch_tanh"),
]
IDS = ["nw50-win2chunks", "nw52-win1chunk", "nw49-win4chunks-tanh"]


def audio_config(spec: dict) -> dict:
    d = {k: v for k, v in spec.items() if k != "seed"}
    return dict(encoder_layers=2, encoder_attention_heads=4, num_mel_bins=128, output_dim=48,
                max_source_positions=64, **d)


def build_pair(spec: dict) -> tuple[Qwen3OmniMoeAudioEncoder, AudioEncoder]:
    """Reference and ours with identical weights, every tensor drawn from a seeded generator."""
    cfg = audio_config(spec)
    ref = Qwen3OmniMoeAudioEncoder(Qwen3OmniMoeAudioEncoderConfig(**cfg)).eval()
    gen = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "layer_norm" in name or name.startswith("ln_post"):
                p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    ours = AudioEncoder(AudioEncoderConfig.from_dict(cfg)).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def random_features(lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, 128, max(lens)]`` log-mel-like features (padding filled with junk) + lengths."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(len(lens), 128, max(lens), generator=gen)
    for b, n in enumerate(lens):
        feats[b, :, n:] = 5.0
    return feats, torch.tensor(lens)


def reference_rows(ref: Qwen3OmniMoeAudioEncoder, feats: torch.Tensor, lens: torch.Tensor,
                   alone: bool) -> torch.Tensor:
    """Reference output in the Thinker's layout: frames concatenated along time (get_audio_features)."""
    with torch.no_grad():
        if alone:
            return torch.cat([ref(feats[b, :, :n], feature_lens=n[None]).last_hidden_state
                              for b, n in enumerate(lens)])
        flat = torch.cat([feats[b, :, :n] for b, n in enumerate(lens)], dim=1)
        return ref(flat, feature_lens=lens).last_hidden_state


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> None:
    assert out.shape == ref.shape
    scale = ref.abs().max().item()
    assert scale > 0
    assert (out - ref).abs().max().item() <= tol * max(scale, 1.0)


def test_state_dict_names_are_the_published_ones():
    ref, ours = build_pair(CONFIGS[0])
    assert set(ours.state_dict()) == set(ref.state_dict())
    assert {"conv2d1.weight", "conv_out.weight", "layers.1.self_attn.q_proj.weight", "ln_post.weight",
            "proj2.bias"} <= set(ours.state_dict())


@pytest.mark.parametrize("spec", CONFIGS, ids=IDS)
def test_batch_of_long_utterances_matches_reference_batch(spec):
    ref, ours = build_pair(spec)
    chunk = 2 * spec["n_window"]
    lens = [3 * chunk + 17, chunk + 1, 2 * chunk, 5 * chunk + 33]  # all >= one chunk: reference is consistent
    feats, lens_t = random_features(lens, spec["seed"] + 10)
    with torch.no_grad():
        out, out_lens = ours(feats, lens_t)
    expected = reference_rows(ref, feats, lens_t, alone=False)
    assert_close(out, expected)
    assert out_lens.tolist() == _get_feat_extract_output_lengths(lens_t, spec["n_window"]).tolist()
    assert int(out_lens.sum()) == out.shape[0]


@pytest.mark.parametrize("spec", CONFIGS, ids=IDS)
def test_mixed_batch_matches_reference_alone_and_ours_alone(spec):
    ref, ours = build_pair(spec)
    chunk = 2 * spec["n_window"]
    lens = [chunk - 3, 4 * chunk + 9, 1, 36, chunk, 2 * chunk + 71]  # includes sub-chunk and odd lengths
    feats, lens_t = random_features(lens, spec["seed"] + 20)
    with torch.no_grad():
        out, out_lens = ours(feats, lens_t)
        singles = [ours(feats[b:b + 1, :, :n], lens_t[b:b + 1]) for b, n in enumerate(lens)]
    assert_close(out, reference_rows(ref, feats, lens_t, alone=True))
    alone = torch.cat([rows for rows, _ in singles])
    assert out_lens.tolist() == [int(n) for _, n in singles]
    assert (out - alone).abs().max().item() <= 1e-5


def test_attention_windows_matter():
    """Guard against a test that would pass with the wrong window: changing it must change the output."""
    spec = CONFIGS[0]
    ref, ours = build_pair(spec)
    feats, lens = random_features([6 * 2 * spec["n_window"] + 40], 3)
    expected = reference_rows(ref, feats, lens, alone=True)
    wide = AudioEncoder(dataclasses.replace(ours.config, n_window_infer=800)).eval()
    wide.load_state_dict(ours.state_dict())
    with torch.no_grad():
        out_wide, _ = wide(feats, lens)
        out, _ = ours(feats, lens)
    assert_close(out, expected)
    assert (out_wide - expected).abs().max().item() > 10 * 1e-4 * max(expected.abs().max().item(), 1.0)


@pytest.mark.parametrize("n_window", [49, 50, 51, 52])
def test_audio_token_count_matches_reference(n_window):
    lens = torch.arange(0, 3001)
    assert torch.equal(audio_token_count(lens, n_window), _get_feat_extract_output_lengths(lens, n_window))
    assert audio_token_count(1000) == 130  # 10 s of audio at the default n_window=50: 13 tokens per second


def test_config_defaults_follow_transformers():
    ours, hf = AudioEncoderConfig.from_dict({}), Qwen3OmniMoeAudioEncoderConfig()
    for field in dataclasses.fields(AudioEncoderConfig):
        assert getattr(ours, field.name) == getattr(hf, field.name), field.name


def test_wrong_mel_bin_count_raises():
    _, ours = build_pair(CONFIGS[0])
    with pytest.raises(ValueError, match="128 mel bins"):
        ours(torch.zeros(1, 80, 200), torch.tensor([200]))
    with pytest.raises(ValueError, match="feature_lens"):
        ours(torch.zeros(1, 128, 200), torch.tensor([201]))
    with pytest.raises(ValueError, match="n_window_infer"):
        AudioEncoderConfig(n_window=50, n_window_infer=99)
