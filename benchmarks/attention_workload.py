"""The workload of ``bench_attention`` and ``attention_extras`` (issues 33, 41): bf16, 16 query / 8 KV heads
x 128 (Qwen3-0.6B's attention), KV block 16, a paged cache over a shuffled block table; CUDA only."""

from __future__ import annotations

import torch

__all__ = ["BLOCK", "D", "DEV", "DTYPE", "HKV", "HQ", "bench_ms", "nbytes", "paged_case"]
HQ, HKV, D, BLOCK = 16, 8, 128, 16
DTYPE = torch.bfloat16
DEV = "cuda"


def bench_ms(fn) -> float:
    """Median ms of ``fn`` by ``triton.testing.do_bench`` (L2 flushed before each call)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def paged_case(batch: int, ctx: int, gen: torch.Generator):
    """``(q, k_cache, v_cache, block_tables, seq_lens)``: ``batch`` sequences of ``ctx`` tokens over blocks
    handed out in a random permutation."""
    blocks = ctx // BLOCK
    kc = torch.randn(batch * blocks, BLOCK, HKV, D, device=DEV, dtype=DTYPE, generator=gen)
    vc = torch.randn(batch * blocks, BLOCK, HKV, D, device=DEV, dtype=DTYPE, generator=gen)
    bt = torch.randperm(batch * blocks, device=DEV, generator=gen).view(batch, blocks).to(torch.int32)
    sl = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DTYPE, generator=gen)
    return q, kc, vc, bt, sl


def nbytes(batch: int, ctx: int) -> int:
    """K and V read plus q and the output written, bf16."""
    return (2 * batch * ctx * HKV * D + 2 * batch * HQ * D) * DTYPE.itemsize
