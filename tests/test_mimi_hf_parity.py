"""Parity of our Mimi (models/moshi/mimi.py) with transformers' ``MimiModel`` (5.19), the oracle: one random
preset in the published (Kyutai) names, renamed here to transformers' layout the way its conversion does
(``in_proj_weight`` split into ``q_proj``/``k_proj``/``v_proj`` with q and k rows permuted from interleaved
RoPE pairs to rotate-half; ``model.{i}`` → ``layers.{i}``; ``rvq_first``/``rvq_rest`` → semantic/acoustic
quantizers). In fp32 over 52 frames of a fixed input: identical codes, waveform within 1 LSB of 16-bit
audio."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import MimiConfig, MimiModel

from omniduplex.models.moshi.checkpoint import published_state, random_models
from omniduplex.models.moshi.config import FRAME_SAMPLES, mimi_config

LSB = 1 / 32768
RENAMES = {
    "self_attn.out_proj.weight": "self_attn.o_proj.weight",
    "linear1.weight": "mlp.fc1.weight",
    "linear2.weight": "mlp.fc2.weight",
    "layer_scale_1.scale": "self_attn_layer_scale.scale",
    "layer_scale_2.scale": "mlp_layer_scale.scale",
}


def hf_config(preset: str) -> MimiConfig:
    cfg = mimi_config(preset)
    se, q, tr = cfg["seanet"], cfg["quantizer"], cfg["transformer"]
    return MimiConfig(
        hidden_size=se["dimension"],
        num_filters=se["n_filters"],
        codebook_size=q["bins"],
        codebook_dim=q["dimension"],
        num_quantizers=q["n_q"],
        vector_quantization_hidden_dimension=q["dimension"],
        upsample_groups=se["dimension"],
        num_hidden_layers=tr["num_layers"],
        intermediate_size=tr["dim_feedforward"],
        num_attention_heads=tr["num_heads"],
        num_key_value_heads=tr["num_heads"],
        head_dim=tr["d_model"] // tr["num_heads"],
        sliding_window=tr["context"],
        rope_theta=tr["max_period"],
        layer_scale_initial_scale=tr["layer_scale"],
    )


def _to_half_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q/k projection from interleaved (re, im) pairs to rotate-half order, per head."""
    d1, d2 = w.shape
    return w.view(heads, d1 // heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2)


def to_hf(state: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        n = re.sub(
            r"^(encoder|decoder)\.model\.(\d+)\.(conv\.conv|convtr\.convtr)\.", r"\1.layers.\2.conv.", k
        )
        n = re.sub(
            r"^(encoder|decoder)\.model\.(\d+)\.block\.(\d+)\.conv\.conv\.", r"\1.layers.\2.block.\3.conv.", n
        )
        n = n.replace("downsample.conv.conv.conv.", "downsample.conv.")
        n = n.replace("upsample.convtr.convtr.convtr.", "upsample.conv.")
        n = n.replace("quantizer.rvq_first.", "quantizer.semantic_residual_vector_quantizer.")
        n = n.replace("quantizer.rvq_rest.", "quantizer.acoustic_residual_vector_quantizer.")
        n = n.replace("vq.layers.", "layers.").replace("._codebook.", ".codebook.")
        n = n.replace("embedding_sum", "embed_sum").replace("_initialized", "initialized")
        m = re.match(r"^(encoder|decoder)_transformer\.transformer\.layers\.(\d+)\.(.*)$", n)
        if m:
            pre, rest = f"{m.group(1)}_transformer.layers.{m.group(2)}.", m.group(3)
            if rest == "self_attn.in_proj_weight":
                qw, kw, vw = v.chunk(3)
                out[pre + "self_attn.q_proj.weight"] = _to_half_rope(qw, heads)
                out[pre + "self_attn.k_proj.weight"] = _to_half_rope(kw, heads)
                out[pre + "self_attn.v_proj.weight"] = vw
                continue
            rest = RENAMES.get(rest, rest).replace("norm1.", "input_layernorm.")
            n = pre + rest.replace("norm2.", "post_attention_layernorm.")
        out[n] = v
    return out


def _check(preset: str) -> None:
    _, mimi = random_models(preset, 0)
    hf = MimiModel(hf_config(preset)).eval()
    heads = mimi_config(preset)["transformer"]["num_heads"]
    hf.load_state_dict(to_hf(published_state(mimi), heads), strict=True)
    g = torch.Generator().manual_seed(1)
    pcm = (torch.randn(1, 1, 52 * FRAME_SAMPLES, generator=g) * 0.3).clamp(-1, 1)
    with torch.no_grad():
        codes = mimi.encode(pcm)
        assert torch.equal(codes, hf.encode(pcm, num_quantizers=8).audio_codes)
        assert len(set(codes[0, 1].tolist())) > 5  # the input shows in the codes
        wave = mimi.decode(codes)
        assert (wave - hf.decode(codes).audio_values).abs().max() <= LSB


def test_tiny_mimi_matches_transformers():
    _check("tiny")


@pytest.mark.slow
def test_small_mimi_matches_transformers():
    _check("small")
