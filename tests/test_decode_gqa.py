"""The q_len = 1 GQA decode fast path (kernels/csrc/decode_gqa.cpp, ``kernels.attention.gqa_decode``)
against the plain-torch paged attention: every dtype and the shapes it takes, ragged and partly filled last
blocks, garbage past the block tables' ends; the shapes it refuses fall back (``None``); bad tables raise; a
model's layers switched onto it give the dispatcher's outputs and are timed."""

from __future__ import annotations

import pytest
import torch

from omniduplex.kernels import attention, cpu_ops
from omniduplex.kernels.paged_attention_ref import paged_attention_torch

cpu_ops.load()  # the CI machine has g++ and ninja: a failed build fails every test here
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _case(seed, num_seqs, num_q_heads, num_kv_heads, head_dim, dtype, max_len=150, block=16):
    g = torch.Generator().manual_seed(seed)
    num_blocks = 48
    k_cache = torch.randn(num_blocks, block, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block, num_kv_heads, head_dim, generator=g).to(dtype)
    seq_lens = torch.randint(1, max_len, (num_seqs,), generator=g, dtype=torch.int32)
    seq_lens[0] = 16  # one sequence ends exactly on a block boundary
    width = -(-max_len // block) + 1
    tables = torch.full((num_seqs, width), -7, dtype=torch.int32)  # unused entries hold garbage
    for s in range(num_seqs):
        need = -(-int(seq_lens[s]) // block)
        tables[s, :need] = torch.randperm(num_blocks, generator=g)[:need].int()
    q = torch.randn(num_seqs, num_q_heads, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, tables, seq_lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((4, 1), 128), ((8, 2), 64), ((4, 4), 16)])
@pytest.mark.parametrize("num_seqs", [1, 3, 16])  # one head per work item, and whole sequences per item
def test_fast_path_equals_torch_reference(dtype, heads, head_dim, num_seqs):
    q, k_cache, v_cache, tables, seq_lens = _case(num_seqs + head_dim, num_seqs, *heads, head_dim, dtype)
    scale = head_dim**-0.5
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32)
    want = paged_attention_torch(q.double(), k_cache.double(), v_cache.double(), tables, seq_lens, qsl, scale)
    got = attention.gqa_decode(q, k_cache, v_cache, tables, seq_lens, scale)
    assert got is not None and got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.double(), want, atol=TOL[dtype], rtol=TOL[dtype])


def test_shapes_outside_the_fast_path_fall_back():
    q, k_cache, v_cache, tables, seq_lens = _case(1, 3, 6, 2, 64, torch.float32)  # GQA group of 3
    assert attention.gqa_decode(q, k_cache, v_cache, tables, seq_lens, 0.1) is None
    q, k_cache, v_cache, tables, seq_lens = _case(1, 3, 4, 2, 48, torch.float32)  # head size 48
    assert attention.gqa_decode(q, k_cache, v_cache, tables, seq_lens, 0.1) is None
    q, k_cache, v_cache, tables, seq_lens = _case(1, 3, 4, 2, 64, torch.float32, block=8)
    assert attention.gqa_decode(q, k_cache, v_cache, tables, seq_lens, 0.1) is None
    q, k_cache, v_cache, tables, seq_lens = _case(1, 3, 4, 2, 64, torch.float32)
    assert attention.gqa_decode(q.bfloat16(), k_cache, v_cache, tables, seq_lens, 0.1) is None  # mixed dtypes
    assert (
        attention.gqa_decode(q[:2], k_cache, v_cache, tables, seq_lens, 0.1) is None
    )  # not one per sequence


def test_bad_tables_raise():
    q, k_cache, v_cache, tables, seq_lens = _case(2, 2, 8, 2, 64, torch.float32)
    bad = tables.clone()
    bad[1, 0] = 999
    with pytest.raises(RuntimeError, match="holds block 999 of 48"):
        attention.gqa_decode(q, k_cache, v_cache, bad, seq_lens, 0.1)
    with pytest.raises(RuntimeError, match="outside \\[1,"):
        attention.gqa_decode(q, k_cache, v_cache, tables, torch.tensor([0, 5], dtype=torch.int32), 0.1)


def test_layers_on_the_fast_path_match_the_dispatcher_and_are_timed():
    from omniduplex.models.config import DecoderConfig
    from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache
    from omniduplex.models.layers import DecoderStack

    cfg = DecoderConfig(
        vocab_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, intermediate_size=96,
    )  # fmt: skip
    stack = DecoderStack(cfg).eval()
    kv = allocate_kv_cache(2, 8, 1, 32)
    prefill = ForwardBatch.contiguous([20, 9], [0, 0])
    decode = ForwardBatch.contiguous([1, 1], [20, 9])
    x = torch.randn(29, 64, generator=torch.Generator().manual_seed(0))
    step = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stack(x, prefill, kv)
        assert attention.set_decode_fast_path(stack, False) == 2
        want = stack(step, decode, kv)[0]
        assert attention.set_decode_fast_path(stack, True) == 2
        with attention.time_decode_attention() as timer:
            got = stack(step, decode, kv)[0]
            stack(x, prefill, kv)  # a prefill step is not timed
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert timer.calls == 2 and timer.seconds > 0
