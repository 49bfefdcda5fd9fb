"""The plain-torch paged attention against a naive float64 per-sequence loop.

The naive reference rebuilds each sequence's contiguous K/V from its blocks one position at a time and
applies an explicit causal softmax, so it shares no code with the batched implementation.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omniduplex.kernels.paged_attention_ref import paged_attention_torch, write_kv_cache

BLOCK = 16
ODD_LENGTHS = [1, 2, 15, 16, 17, 31, 33, 48, 63]


def build_case(specs, num_q_heads, num_kv_heads, head_dim, dtype, seed, garbage=1e4):
    """Build a paged batch. ``specs``: list of ``(seq_len, q_len)``.

    Blocks are handed out in a random permutation (non-contiguous, out of order), unused block-table
    entries and never-written cache rows hold garbage, and K/V are written through ``write_kv_cache``.
    Returns a dict of the kernel arguments.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-seq_len // BLOCK) for seq_len, _ in specs]
    max_blocks = max(blocks_per_seq) + 1
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.randint(-7, 10**6, (len(specs), max_blocks), generator=gen, dtype=torch.int32)
    k_cache = torch.empty(num_blocks, BLOCK, num_kv_heads, head_dim).uniform_(
        -garbage, garbage, generator=gen
    )
    v_cache = torch.empty_like(k_cache).uniform_(-garbage, garbage, generator=gen)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    used, slots = 0, []
    for s, (seq_len, _) in enumerate(specs):
        ids = perm[used : used + blocks_per_seq[s]]
        used += blocks_per_seq[s]
        block_tables[s, : len(ids)] = ids.to(torch.int32)
        slots += [int(ids[p // BLOCK]) * BLOCK + p % BLOCK for p in range(seq_len)]
    n = len(slots)
    k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    write_kv_cache(k_cache, v_cache, k, v, torch.tensor(slots, dtype=torch.int64))
    q_lens = [q_len for _, q_len in specs]
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=gen).to(dtype)
    query_start_loc = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor([s for s, _ in specs], dtype=torch.int32),
        query_start_loc=query_start_loc,
        scale=head_dim**-0.5,
    )


def naive_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale):
    """Float64, one sequence and one position at a time."""
    num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[s])
        start, end = int(query_start_loc[s]), int(query_start_loc[s + 1])
        rows = [(int(block_tables[s, p // BLOCK]), p % BLOCK) for p in range(seq_len)]
        keys = torch.stack([k_cache[b, r] for b, r in rows]).double()  # [L, Hkv, D]
        values = torch.stack([v_cache[b, r] for b, r in rows]).double()
        for i, t in enumerate(range(start, end)):
            pos = seq_len - (end - start) + i
            for h in range(num_q_heads):
                scores = keys[: pos + 1, h // group] @ q[t, h].double() * scale  # [pos + 1]
                weights = torch.softmax(scores, dim=0)
                out[t, h] = weights @ values[: pos + 1, h // group]
    return out


def check(case, atol, rtol=0.0, **hints):
    out = paged_attention_torch(**case, **hints)
    assert out.dtype == case["q"].dtype and out.shape == case["q"].shape
    expected = naive_attention(**case)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)


MIXED = [(1, 1), (15, 15), (16, 1), (17, 5), (33, 33), (40, 1), (63, 17)]


@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_mixed_batch_fp32(ratio):
    check(build_case(MIXED, 2 * ratio, 2, 32, torch.float32, seed=ratio), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_batch_low_precision(dtype):
    check(build_case(MIXED, 8, 2, 64, dtype, seed=3), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("ratio", [1, 4])
def test_decode_only_fp32(ratio):
    specs = [(n, 1) for n in (1, 15, 16, 17, 33, 64, 97)]
    case = build_case(specs, 4 * ratio, 4, 16, torch.float32, seed=11)
    check(case, atol=1e-5)
    check(case, atol=1e-5, max_seq_len=97, max_query_len=1)


def test_prefill_only_and_host_hints():
    specs = [(17, 17), (33, 9), (5, 5)]
    case = build_case(specs, 4, 2, 32, torch.float32, seed=5)
    check(case, atol=1e-5)
    check(case, atol=1e-5, max_seq_len=33, max_query_len=17)
    check(case, atol=1e-5, max_seq_len=200, max_query_len=40)  # loose upper bounds are allowed


def test_unwritten_rows_may_hold_nan():
    """Rows past seq_len and unused blocks are never read, so NaN there (e.g. torch.empty) is harmless."""
    specs = [(17, 1), (3, 3), (40, 1), (33, 7)]
    case = build_case(specs, 4, 2, 16, torch.float32, seed=8, garbage=1.0)
    written = torch.zeros(case["k_cache"].shape[:2], dtype=torch.bool)
    for s, (seq_len, _) in enumerate(specs):
        for p in range(seq_len):
            written[int(case["block_tables"][s, p // BLOCK]), p % BLOCK] = True
    case["k_cache"][~written] = float("nan")
    case["v_cache"][~written] = float("nan")
    out = paged_attention_torch(**case)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), naive_attention(**case), atol=1e-5, rtol=0)


def test_empty_batch():
    case = build_case([(4, 1)], 2, 2, 16, torch.float32, seed=0)
    case["q"] = case["q"][:0]
    case["query_start_loc"] = torch.zeros(2, dtype=torch.int32)
    assert paged_attention_torch(**case).shape == (0, 2, 16)


def test_write_kv_cache_targets_slots():
    k_cache = torch.zeros(4, BLOCK, 2, 8)
    v_cache = torch.zeros(4, BLOCK, 2, 8)
    slots = torch.tensor([3 * BLOCK + 5, 0, 1 * BLOCK + 15], dtype=torch.int64)
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    write_kv_cache(k_cache, v_cache, k, v, slots)
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(k_cache[slot // BLOCK, slot % BLOCK], k[i])
        assert torch.equal(v_cache[slot // BLOCK, slot % BLOCK], v[i])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 3
    with pytest.raises(ValueError):
        write_kv_cache(k_cache, v_cache, k[:, :1], v, slots)


def test_rejects_bad_gqa_ratio():
    case = build_case([(4, 1)], 3, 2, 16, torch.float32, seed=0)
    with pytest.raises(ValueError):
        paged_attention_torch(**case)


seq_spec = st.tuples(st.sampled_from(ODD_LENGTHS), st.integers(0, 40), st.booleans()).map(
    # (prior context, new tokens, decode?) -> (seq_len, q_len)
    lambda t: (t[0] + 1, 1) if t[2] else (t[0] + t[1] + 1, t[1] + 1)
)


@settings(max_examples=12, deadline=None)
@given(
    specs=st.lists(seq_spec, min_size=1, max_size=5),
    num_kv_heads=st.sampled_from([1, 2]),
    ratio=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 24, 64]),
    low_precision=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_batches(specs, num_kv_heads, ratio, head_dim, low_precision, seed):
    dtype = torch.bfloat16 if low_precision else torch.float32
    case = build_case(specs, num_kv_heads * ratio, num_kv_heads, head_dim, dtype, seed)
    if low_precision:
        check(case, atol=2e-2, rtol=2e-2)
    else:
        check(case, atol=1e-5)


def test_workspace_survives_inference_mode_switches():
    """The reused CPU gather buffer must work whether it was first made in or out of inference mode."""
    from omniduplex.kernels import paged_attention_torch

    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(8, 16, 2, 16), torch.randn(8, 16, 2, 16)
    q = torch.randn(3, 4, 16)
    args = (
        k_cache,
        v_cache,
        torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32),
        torch.tensor([20, 30, 17], dtype=torch.int32),
        torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        0.25,
    )
    with torch.inference_mode():
        first = paged_attention_torch(q * 1.0, *args).clone()
    big_q = torch.randn(3, 4, 16)
    with torch.no_grad():
        paged_attention_torch(big_q, *args)
        again = paged_attention_torch(q, *args)
    torch.testing.assert_close(again, first)
