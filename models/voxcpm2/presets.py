"""Deterministic random-weight VoxCPM2 checkpoints in the published layout (``init-model --arch voxcpm2-…``).

Presets: ``tiny`` (tests; the published config's switches: ``use_mup`` off, LongRoPE short factors at scale
1, a NoPE residual LM, depthwise AudioVAE with scale/bias rate conditioning), ``deep`` (parity only: 4 LM, 2
residual, 2 encoder, 2 DiT layers, ``use_mup`` on (scaled embeddings and residuals), LongRoPE long factors
with a scaling factor, a rotary residual LM, GQA 4:1, head size ≠ width / heads as the published local
encoder, a dense AudioVAE with additive rate conditioning) and ``small`` (CPU benchmarks). All keep the
published rates: 16 kHz in, 640 samples per 25 Hz latent frame, 1920 output samples per frame at 48 kHz,
patches of 4 frames (6.25 Hz LM).

Files: ``config.json``, ``model.safetensors``, ``audiovae.safetensors`` (convolutions weight-normalised, as
``weight_g`` / ``weight_v``), ``tokenizer.json`` + ``tokenizer_config.json`` (a Llama-style BPE with byte
fallback and Metaspace, the pipeline ``transformers``' ``LlamaTokenizerFast`` builds, ids 0–2 ``<unk> <s>
</s>``, 101–104 the audio markers, a few merges including multi-character CJK tokens). Every tensor is drawn
from a generator seeded by ``(seed, tensor name)``: the same arguments give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from omniduplex.models.checkpoint import published_shapes_of
from omniduplex.models.voxcpm2.audio_vae import AudioVAE, CausalConv, CausalConvT, ResidualUnit
from omniduplex.models.voxcpm2.config import ARCHITECTURE, VoxCPM2Config
from omniduplex.models.voxcpm2.model import VoxCPM2Model

PRESETS = ("tiny", "small", "deep")
SPECIAL_TOKENS = {
    0: "<unk>",
    1: "<s>",
    2: "</s>",
    101: "<|audio_start|>",
    102: "<|audio_end|>",
    103: "<|ref_audio_start|>",
    104: "<|ref_audio_end|>",
}
MERGES = [
    ("▁", "t"),
    ("h", "e"),
    ("▁t", "he"),
    ("▁", "a"),
    ("i", "n"),
    ("你", "好"),
    ("世", "界"),
    ("▁", "你好"),
]


def _lm(hidden, layers, heads, kv, head_dim, inter, vocab, max_pos, orig, use_mup) -> dict:
    half = head_dim // 2
    return dict(
        bos_token_id=1,
        eos_token_id=2,
        hidden_size=hidden,
        intermediate_size=inter,
        max_position_embeddings=max_pos,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        num_key_value_heads=kv,
        rms_norm_eps=1e-5,
        rope_theta=10000,
        kv_channels=head_dim,
        rope_scaling=dict(
            type="longrope",
            long_factor=[1.0 + 3.0 * i / half for i in range(half)],
            short_factor=[1.0 + 0.5 * i / half for i in range(half)],
            original_max_position_embeddings=orig,
        ),
        vocab_size=vocab,
        use_mup=use_mup,
        scale_emb=12,
        dim_model_base=256,
        scale_depth=1.4,
    )


def voxcpm2_config(preset: str) -> dict:
    """``config.json`` of a preset. Raises ValueError for an unknown preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESETS)}")
    lm, res, enc, dit, feat, fsq, vae = {
        "tiny": (
            _lm(64, 2, 4, 2, 16, 128, 512, 1024, 1024, False),
            (1, True),
            dict(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=1, kv_channels=16),
            dict(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=1, kv_channels=16),
            16,
            16,
            dict(encoder_dim=4, decoder_dim=64, depthwise=True, cond_type="scale_bias"),
        ),
        "deep": (
            _lm(96, 4, 8, 2, 16, 160, 512, 2048, 512, True),
            (2, False),
            dict(hidden_dim=48, ffn_dim=96, num_heads=4, num_layers=2, kv_channels=16),
            dict(hidden_dim=48, ffn_dim=96, num_heads=4, num_layers=2, kv_channels=16),
            16,
            24,
            dict(encoder_dim=4, decoder_dim=64, depthwise=False, cond_type="add"),
        ),
        "small": (
            _lm(256, 6, 8, 2, 32, 768, 1024, 4096, 4096, False),
            (2, True),
            dict(hidden_dim=128, ffn_dim=384, num_heads=4, num_layers=2, kv_channels=32),
            dict(hidden_dim=128, ffn_dim=384, num_heads=4, num_layers=4, kv_channels=32),
            64,
            128,
            dict(encoder_dim=16, decoder_dim=256, depthwise=True, cond_type="scale_bias"),
        ),
    }[preset]
    return dict(
        architecture=ARCHITECTURE,
        lm_config=lm,
        patch_size=4,
        feat_dim=feat,
        scalar_quantization_latent_dim=fsq,
        scalar_quantization_scale=9,
        residual_lm_num_layers=res[0],
        residual_lm_no_rope=res[1],
        encoder_config=enc,
        dit_config=dict(
            **dit,
            mean_mode=False,
            cfm_config=dict(sigma_min=1e-6, solver="euler", t_scheduler="log-norm", inference_cfg_rate=2.0),
        ),
        audio_vae_config=dict(
            encoder_rates=[2, 5, 8, 8],
            latent_dim=feat,
            decoder_rates=[8, 6, 5, 2, 2, 2],
            sr_bin_boundaries=[20000, 30000, 40000],
            sample_rate=16000,
            out_sample_rate=48000,
            **vae,
        ),
        max_length=512 if preset != "small" else 2048,
        device="cpu",
        dtype="float32",
    )


def _gen(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _draw(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    """An LM-side tensor: norms 1, biases N(0, 0.02²), the CLS token N(0, 1), matrices N(0, std²)."""
    g = _gen(seed, name)
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.randn(shape, generator=g) * 0.02
    if name.endswith("special_token"):
        return torch.randn(shape, generator=g)
    return torch.randn(shape, generator=g) * std


def _vae_tensors(vae: AudioVAE, seed: int) -> dict[str, torch.Tensor]:
    """AudioVAE tensors in the published names: convs as ``weight_v`` N(0, gain² / fan-in) and ``weight_g =
    ‖weight_v‖`` (so the folded weight is ``weight_v``), Snake ``alpha`` 1 + N(0, 0.1²), rate scales
    1 + N(0, 0.1²), rate biases and conv biases N(0, 0.01²)."""
    out: dict[str, torch.Tensor] = {}
    convs = {n for n, m in vae.named_modules() if isinstance(m, (CausalConv, CausalConvT))}
    for name, t in vae.state_dict().items():
        key = "audiovae/" + name
        g = _gen(seed, key)
        mod = name.rsplit(".", 1)[0]
        if name.endswith("sr_bin_boundaries"):
            out[name] = t.clone()
        elif mod in convs and name.endswith(".weight"):
            conv = vae.get_submodule(mod)  # [out, in / groups, k]; transposed: [in, out, k], k / stride taps
            fan_in = t.shape[1] * t.shape[2]
            if isinstance(conv, CausalConvT):
                fan_in = t.shape[0] * t.shape[2] // conv.stride[0]
            v = torch.randn(t.shape, generator=g) * (_gain(vae, mod) / math.sqrt(fan_in))
            out[mod + ".weight_v"] = v
            out[mod + ".weight_g"] = v.flatten(1).norm(dim=1).reshape(-1, *([1] * (v.dim() - 1)))
        elif name.endswith("alpha") or name.endswith("scale_embed.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(t.shape, generator=g)
        else:
            out[name] = 0.01 * torch.randn(t.shape, generator=g)
    return out


def _gain(vae: AudioVAE, conv: str) -> float:
    """Weight gain of a conv: 0.3 inside residual units, 0.4 for the decoder's output conv, 0.8 elsewhere
    (a waveform of std ~0.1, far from tanh's saturation, and a small gain from latents to samples)."""
    parent = vae.get_submodule(conv.rsplit(".", 2)[0]) if conv.count(".") >= 2 else None
    if isinstance(parent, ResidualUnit):
        return 0.3
    return 0.4 if conv == f"decoder.model.{len(vae.decoder.model) - 2}" else 0.8


def build_tokenizer() -> Tokenizer:
    """The presets' Llama-style tokenizer (module docstring)."""
    vocab = {SPECIAL_TOKENS.get(i, f"<|reserved_{i}|>"): i for i in range(105)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in ["▁"] + [chr(c) for c in range(33, 127)] + list("你好世界"):
        vocab.setdefault(c, len(vocab))
    for a, b in MERGES:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=MERGES, fuse_unk=True, byte_fallback=True, unk_token="<unk>")
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken(SPECIAL_TOKENS[i], special=True) for i in sorted(SPECIAL_TOKENS)])
    return tok


def write_voxcpm2_checkpoint(out: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a preset's checkpoint folder (module docstring). Deterministic. Returns ``out``.

    Raises ValueError for an unknown preset (before anything is written).
    """
    raw = voxcpm2_config(preset)
    cfg = VoxCPM2Config.from_dict(raw)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    std = 0.02 if preset == "small" else 0.05
    shapes = published_shapes_of(VoxCPM2Model(cfg))
    main = {n: _draw(n, s, seed, std) for n, s in sorted(shapes.items())}
    save_file(main, str(out / "model.safetensors"), metadata={"format": "pt"})
    vae = _vae_tensors(AudioVAE(cfg.vae), seed)
    save_file(dict(sorted(vae.items())), str(out / "audiovae.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    build_tokenizer().save(str(out / "tokenizer.json"))
    tok_cfg = dict(
        tokenizer_class="LlamaTokenizerFast",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        add_bos_token=True,
        add_eos_token=False,
    )
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")
    return out
