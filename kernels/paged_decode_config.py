"""Launch policy of the paged decode kernel (:mod:`.paged_decode_attention`): tile size, warps, pipeline
stages and the split-KV factor, as pure functions of host-side shapes and the GPU's traits (no autotuning,
no device data), so a launch is reproducible, interpretable on CPU and capturable in a CUDA graph."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "PROGRAMS_PER_SM",
    "TILE_BYTES",
    "DecodeConfig",
    "choose_config",
    "choose_num_splits",
    "choose_split_plan",
    "next_pow2",
    "split_workspace_numel",
]


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def _floor_pow2(n: int) -> int:
    return 1 << max(1, int(n)).bit_length() - 1


@dataclass(frozen=True)
class DecodeConfig:
    """Launch configuration of the decode kernel.

    Attributes:
        block_n: tokens per loop iteration (a power of two >= 16; whole 16-row KV blocks at block size 16).
        num_warps: warps per program.
        num_stages: software-pipelining depth of the K/V loads (1 = none).
    """

    block_n: int
    num_warps: int
    num_stages: int


TILE_BYTES = 32 * 1024
"""K+V bytes one loop iteration loads (per program): enough in flight for HBM latency, small enough that
2-3 pipelined stages fit in shared memory beside the layout conversions."""


@functools.cache
def choose_config(
    head_dim: int, group: int, dtype: torch.dtype, capability: tuple[int, int] | None
) -> DecodeConfig:
    """Pick tile size, warps and pipeline stages for the decode kernel. Pure.

    ``block_n = TILE_BYTES / (2 * next_pow2(head_dim) * itemsize)`` clamped to [16, 128] (bf16 x 128 -> 64
    tokens = 4 KV blocks, fp32 x 128 -> 32, bf16 x 64 -> 128), halved while the score tile
    ``BLOCK_G x block_n`` exceeds 4096 fp32 values (large GQA groups); 4 warps (8 once a K tile holds more
    than 8192 elements); 3 stages on GPUs with >= 160 KiB of shared memory per SM (sm80, sm90, sm100: 3 x
    32 KiB), 2 on the ~100 KiB consumer parts (sm86/89/120), 1 before Ampere and under the interpreter
    (``capability`` None).

    Args:
        head_dim: elements per head (any positive size; padded to a power of two >= 16 in registers).
        group: query heads per KV head.
        dtype: cache dtype (fp32, bf16 or fp16).
        capability: CUDA compute capability ``(major, minor)``, or None off CUDA.
    """
    block_d = max(16, next_pow2(head_dim))
    block_g = max(16, next_pow2(group))
    itemsize = dtype.itemsize
    block_n = min(128, max(16, _floor_pow2(TILE_BYTES // (2 * block_d * itemsize))))
    while block_g * block_n > 4096 and block_n > 16:
        block_n //= 2
    num_warps = 8 if block_n * block_d > 8192 else 4
    if capability is None or capability < (8, 0):
        stages = 1
    elif capability in ((8, 0), (9, 0)) or capability[0] == 10:
        stages = 3
    else:
        stages = 2
    return DecodeConfig(block_n=block_n, num_warps=num_warps, num_stages=stages)


PROGRAMS_PER_SM = 4
"""Decode programs resident per SM with the default bf16 x 128 config, as compiled for sm80/sm90 by Triton
3.7.1 (``tests/test_triton_compile.py``): 127 registers x 128 threads and 39 KiB of shared memory each, so the
65,536 registers of an SM hold 4."""


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_tiles: int, num_sms: int, max_splits: int = 64
) -> int:
    """Split-KV factor (Flash-Decoding): as many splits as keep the ``num_seqs * num_kv_heads * splits``
    programs within one wave of ``PROGRAMS_PER_SM * num_sms`` resident programs (1 once the batch alone
    fills it), at most one per ``block_n``-token tile of the longest possible sequence (``max_tiles``, from
    the host-side upper bound) and at most ``max_splits``. Pure; never looks at device data.

    E.g. 132 SMs (H100), 8 KV heads, a 4096-token bound in 64-token tiles: batch 1 -> 64 splits (one tile
    each), 8 -> 8, 16 -> 4, 32 -> 2, >= 34 -> 1.
    """
    programs = max(num_seqs * num_kv_heads, 1)
    return max(1, min(PROGRAMS_PER_SM * num_sms // programs, max_tiles, max_splits))


def choose_split_plan(
    seq_lens: Sequence[int],
    num_kv_heads: int,
    block_n: int,
    num_sms: int,
    max_splits: int = 64,
) -> tuple[int, int]:
    """Split-KV plan from the REAL context lengths (host side, e.g. the engine's step inputs): FlashInfer's
    decode plan (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch`` in flashinfer
    ``include/flashinfer/attention/scheduler.cuh``, its grid bound ``max_grid_size`` = resident blocks per
    SM x SMs, no split once ``batch x kv_heads`` reaches it; Ye et al. 2025, arXiv:2501.01005) on
    Flash-Decoding's split-KV (Dao et al. 2023). Pure; O(S log T).

    Every sequence is cut into splits of one length ``split_len`` (whole ``block_n`` tiles), so a sequence of
    ``n`` tiles runs ``ceil(n / T)`` programs per KV head and a short one runs few: the binary search finds
    the smallest ``T`` (tiles per split) with ``num_kv_heads * sum_i ceil(n_i / T) <= PROGRAMS_PER_SM *
    num_sms`` (one resident wave: 528 programs on a 132-SM H100/H200, every program's loads in flight at
    once) and ``ceil(max_i n_i / T) <= max_splits``. The critical path is then ``T`` tiles, set by the total
    work rather than by the longest sequence times the batch (:func:`choose_num_splits`' even cut), which
    matters for ragged batches: 8 sequences of 4096 + 7 x 100 tokens (64-token tiles) -> ``T = 2`` (32
    splits for the long one, 2 for each short one) where the bound-sized even cut gives 8 tiles a program.
    A batch that fills the wave on its own is not split. Why one wave and not more: a decode program is
    latency-bound (its tiles' loads are the whole work), so the used programs should all be resident at
    once, each with its tiles' loads in flight; splitting further shortens each program but adds partials
    (``group x (head_dim + 2)`` fp32 per program) and combine reads, and a second wave only queues.

    Args:
        seq_lens: context length of each sequence (tokens incl. this step's; ``<= 0`` for padding rows).
        num_kv_heads: KV heads (programs per split: one covers a KV head's whole GQA group).
        block_n: tokens per kernel tile (:attr:`DecodeConfig.block_n`).
        num_sms: streaming multiprocessors of the GPU.
        max_splits: most splits for one sequence (the combine pass reads ``next_pow2`` of it per head).

    Returns:
        ``(num_splits, split_len)``: grid splits per ``(sequence, KV head)`` (the longest sequence's split
        count) and tokens per split (a multiple of ``block_n``; 0 when ``num_splits == 1``).

    E.g. 132 SMs, 8 KV heads, 64-token tiles: batch 1 x 4096 -> (64, 64); 8 x 4096 -> (8, 512); 32 x 1024
    -> (2, 512); 64 x 4096 -> (1, 0).
    """
    tiles = [max(0, -(-int(n) // block_n)) for n in seq_lens]
    longest = max(tiles, default=0)
    budget = PROGRAMS_PER_SM * num_sms // max(num_kv_heads, 1)  # splits summed over the batch
    if longest <= 1 or len(tiles) >= budget:
        return 1, 0
    lo, hi = max(1, -(-longest // max_splits)), longest  # hi always fits: sum of ceil(n / longest) <= S
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(-(-n // mid) for n in tiles) <= budget:
            hi = mid
        else:
            lo = mid + 1
    num_splits = -(-longest // lo)
    return (num_splits, lo * block_n) if num_splits > 1 else (1, 0)


def split_workspace_numel(num_seqs: int, num_q_heads: int, num_splits: int, head_dim: int) -> int:
    """fp32 elements of the split-KV workspace: ``acc [S, Hq, P, D]``, then ``max`` and ``sum [S, Hq, P]``."""
    return num_seqs * num_q_heads * num_splits * (head_dim + 2)
