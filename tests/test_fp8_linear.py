"""FP8 (e4m3) weights with a CPU twin (kernels/fp8_linear.py): the quantization's error bound, the small
Qwen3-MoE preset's logits with e4m3 linears and experts against bf16, and the memory accounting of the real
Qwen3-Omni-30B-A3B Thinker (meta device: no memory used)."""

from __future__ import annotations

import pytest
import torch

from omniduplex.kernels.fp8_linear import (
    E4M3_MAX,
    Fp8Linear,
    dequantize_fp8,
    quantize_fp8,
    quantize_fp8_,
)
from omniduplex.models.moe_experts import Experts


def test_e4m3_per_channel_error_is_within_the_format_rounding():
    w = torch.randn(3, 40, 64) * torch.logspace(-3, 1, 40)[None, :, None]  # [E, out, in], rows of any range
    w[1, 7] = 0.0
    q, scale = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 40)
    assert torch.allclose(q.float().abs().amax(-1)[w.abs().amax(-1) > 0], torch.tensor(E4M3_MAX))
    back = dequantize_fp8(q, scale, torch.float32)
    # e4m3: 3 mantissa bits, so a normal value rounds within 2^-4 of itself; values below e4m3's smallest
    # normal (2^-6 of the scale) round to a multiple of 2^-9 of the scale
    bound = torch.maximum(w.abs() * 2**-4, scale[..., None] * 2**-10)
    assert torch.all((back - w).abs() <= bound * (1 + 1e-6))
    assert scale[1, 7] == 1.0 and not back[1, 7].any()
    with pytest.raises(ValueError, match="inf or NaN"):
        quantize_fp8(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(ValueError, match="float weight"):
        quantize_fp8(torch.ones(4))


def _logits(thinker, ids: list[int], dtype=torch.bfloat16) -> torch.Tensor:
    from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache

    cfg = thinker.cfg
    kv = allocate_kv_cache(cfg.num_hidden_layers, 8, cfg.num_key_value_heads, cfg.head_dim, dtype)
    with torch.inference_mode():
        hidden, _ = thinker(thinker.embed(torch.tensor(ids)), ForwardBatch.contiguous([len(ids)], [0]), kv)
        return thinker.compute_logits(hidden).float()


def test_small_moe_preset_fp8_logits_near_bf16(tmp_path):
    from omniduplex.models.qwen3_omni.presets import write_checkpoint
    from omniduplex.models.registry import load_model

    d = write_checkpoint(tmp_path / "small", "small", text_only=True)
    ids = [(37 * i + 11) % 1000 for i in range(48)]
    exact = _logits(load_model(d, parts=("thinker",)).thinker, ids, torch.float32)
    model = load_model(d, parts=("thinker",), dtype=torch.bfloat16)
    want = _logits(model.thinker, ids)
    n = quantize_fp8_(model.thinker)
    cfg = model.thinker.cfg
    assert n == cfg.num_hidden_layers * 4  # qkv, o, experts' gate_up and down per layer (lm_head stays)
    layer = model.thinker.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Fp8Linear)
    assert isinstance(layer.mlp.experts, Experts) and layer.mlp.experts.gate_up_q.dtype == torch.float8_e4m3fn
    got = _logits(model.thinker, ids)
    # e4m3 keeps 3 mantissa bits to bf16's 7. Measured on this random-weight preset: fp8 vs bf16 mean
    # |error| 7.5% of the logits' spread (max 71%: near-uniform random logits), 3.2x the bf16 model's own
    # error against fp32. Bounds: 1.5x the first, 5x the bf16 error (errors of the 16x coarser step average
    # over the sums).
    spread = want.std()
    assert (got - want).abs().mean() < 0.11 * spread
    assert (got - exact).abs().mean() < 5 * (want - exact).abs().mean()


def test_real_omni_thinker_fits_an_80gb_gpu_with_room_in_fp8():
    from omniduplex.models.real_shapes import memory_budget_gib

    bf16 = memory_budget_gib("qwen3-omni-30b-a3b")
    fp8 = memory_budget_gib("qwen3-omni-30b-a3b", fp8_thinker=True)
    assert 60 < bf16["weights"] < 70  # ~64.7 GiB (published ~35B parameters at 2 bytes)
    # the Thinker's LM (attention + 48 layers × 128 experts) at 1 byte: the whole graph's weights drop to
    # ~36 GiB, leaving ~40 GiB of an 80 GB H100 (78 GiB usable) for KV cache and activations
    assert 30 < fp8["weights"] < 40 and fp8["fp8_thinker_gib"] > 25
    assert bf16["weights"] - fp8["weights"] > 25
