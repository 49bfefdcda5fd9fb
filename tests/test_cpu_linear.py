"""oneDNN-prepacked bf16 linears: same products as ``F.linear``, bounded kernel shapes, a no-op where the CPU
has no native bf16 (then every assertion below is about the unpacked model, which must be untouched)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omniduplex.kernels.cpu_linear import bucket_rows, can_pack, pack, packed_linear, prepack_linears, warm_up
from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model

NATIVE_BF16 = can_pack(torch.zeros(2, 2, dtype=torch.bfloat16))


def test_row_buckets_cover_every_count_with_few_shapes():
    sizes = [bucket_rows(m) for m in range(1, 2049)]
    assert all(b >= m for m, b in zip(range(1, 2049), sizes))
    assert all(b - m < max(8, m // 8 + 1) * 8 for m, b in zip(range(1, 2049), sizes))  # waste stays small
    assert sizes[:8] == list(range(1, 9))
    assert len(set(sizes)) <= 8 + 7 + 15 + 4


def test_fp32_weights_are_never_packed():
    assert not can_pack(torch.zeros(4, 4))


@pytest.mark.parametrize("rows", [1, 5, 9, 37, 300])
def test_packed_product_equals_f_linear(rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g).bfloat16()
    x = torch.randn(rows, 64, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16()
    want = F.linear(x.float(), w.float(), bias.float())
    if not NATIVE_BF16:
        assert prepack_linears(torch.nn.Linear(64, 96).bfloat16()) == 0
        return
    got = packed_linear(x, pack(w), bias)
    assert got.shape == (rows, 96) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


def test_prepacked_thinker_gives_the_same_logits(tmp_path):
    d = write_checkpoint(tmp_path / "m", "tiny", seed=2, text_only=True)
    plain = load_model(d, dtype=torch.bfloat16).thinker
    packed = load_model(d, dtype=torch.bfloat16).thinker
    n = prepack_linears(packed)
    cfg = plain.cfg
    if not NATIVE_BF16:
        assert n == 0
        return
    # q/k/v, o per layer, experts (gate_up and down per expert), lm_head
    assert n == cfg.num_hidden_layers * (2 + 2 * cfg.num_experts) + 1
    assert warm_up(packed, 40) > 0
    ids = torch.tensor([3, 17, 250, 9, 9, 41, 7])

    def logits(model):
        kv = allocate_kv_cache(
            cfg.num_hidden_layers, 4, cfg.num_key_value_heads, cfg.head_dim, torch.bfloat16
        )
        with torch.inference_mode():
            hidden, _ = model(model.embed(ids), ForwardBatch.contiguous([len(ids)], [0]), kv)
            return model.compute_logits(hidden).float()

    torch.testing.assert_close(logits(packed), logits(plain), rtol=3e-2, atol=3e-2)
