"""Triton paged decode attention (one query per sequence): the launcher and its policy.

The kernels and their design and bandwidth notes are in :mod:`.paged_decode_kernels` (vLLM PagedAttention
layout, FlashAttention-2 online softmax, Flash-Decoding split-KV); tile sizes, warps, stages and the split
count are chosen on the host by the pure functions of :mod:`.paged_decode_config`, from the batch shape and
the real lengths when the caller has them on the host (``seq_lens_host``), else an upper bound of the
length, never from device data, so a call can be captured in a CUDA graph. This
module checks the arguments, picks the config, owns the split workspaces and launches the kernels (decode,
then the log-sum-exp combine when split). Importing it does not import triton.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import replace

import torch

from omniduplex.kernels.paged_decode_config import (
    DecodeConfig,
    choose_config,
    choose_num_splits,
    choose_split_plan,
    next_pow2,
    split_workspace_numel,
)
from omniduplex.kernels.paged_decode_kernels import (
    DTYPES,
    HAS_TRITON,
    LOG2E,
    interpreted,
    kernels,
    out_of_resources,
)
from omniduplex.kernels.paged_shapes import check_attention_heads

__all__ = [
    "HAS_TRITON",
    "DecodeConfig",
    "fits_triton_decode",
    "choose_config",
    "choose_num_splits",
    "choose_split_plan",
    "paged_decode_attention_triton",
    "split_workspace_numel",
]


@functools.cache
def _device_traits(device: torch.device) -> tuple[int, tuple[int, int] | None]:
    """``(streaming multiprocessors, compute capability)`` of a CUDA device; CPU cores and None for the
    interpreter."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.multi_processor_count, (props.major, props.minor)
    return os.cpu_count() or 1, None


def fits_triton_decode(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether :func:`paged_decode_attention_triton` takes these dtypes: ``q`` and the cache of one dtype
    among fp32, bf16 and fp16 (any head size). The dispatcher keeps other batches on the torch path."""
    return q.dtype in DTYPES and k_cache.dtype == q.dtype


_workspaces: dict[tuple, torch.Tensor] = {}
_MAX_WORKSPACES = 64


def _workspace(device: torch.device, numel: int) -> torch.Tensor:
    """A cached fp32 buffer of ``numel`` elements for ``device`` and its current stream: the same memory for
    every call of one size on one stream (so a CUDA graph's replays read what its kernels wrote), used in
    stream order; another stream gets its own, so concurrent streams never share partials."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream, numel)
    buf = _workspaces.get(key)
    if buf is None:
        if len(_workspaces) >= _MAX_WORKSPACES:
            _workspaces.pop(next(iter(_workspaces)))
        buf = _workspaces[key] = torch.empty(numel, dtype=torch.float32, device=device)
    return buf


_degraded: dict[tuple, DecodeConfig] = {}


def _launch_decode(kernel, grid, args, consts: dict, cfg: DecodeConfig, key: tuple) -> int:
    """Launch with ``cfg``; if the compiled kernel needs more shared memory than the GPU has (Triton's
    ``OutOfResources``, raised by the first launch of a shape), retry once without pipelining and with half
    the tile, and keep that config for ``key``. Returns the ``block_n`` launched (the combine's tiles)."""
    cfg = _degraded.get(key, cfg)
    try:
        kernel[grid](*args, **consts, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    except out_of_resources():
        cfg = _degraded[key] = replace(cfg, block_n=max(16, cfg.block_n // 2), num_stages=1)
        kernel[grid](*args, **consts, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return cfg.block_n


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    *,
    max_seq_len: int | None = None,
    seq_lens_host: Sequence[int] | torch.Tensor | None = None,
    split_len: int | None = None,
    config: DecodeConfig | None = None,
    workspace: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention (one query per sequence) over the paged KV cache.

    Args:
        q: ``[num_seqs, num_q_heads, head_dim]``, fp32/bf16/fp16, last dim contiguous.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, dtype of ``q``, last dim
            contiguous; ``block_size`` a power of two ``>= 16``.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``; entries past a sequence's length are
            never read (any value).
        seq_lens: int32 ``[num_seqs]``, cached tokens including this step's; the query sits at position
            ``seq_len - 1`` and attends to ``0..seq_len - 1``. ``seq_len <= 0`` (padding rows) yields zeros.
        scale: softmax scale, usually ``head_dim ** -0.5``.
        num_splits: split-KV factor; ``None`` picks one (see ``seq_lens_host``), 1 forces the single
            pass, ``> 1`` the split + combine with each sequence cut evenly (clamped to the number of
            tiles of the bound).
        max_seq_len: host-side upper bound of ``seq_lens`` (a CUDA-graph bucket's bound); only sizes the
            split count (:func:`choose_num_splits`), so a bound that is too small costs speed, never
            correctness. Default: the block-table width. No device-to-host sync either way.
        seq_lens_host: the same lengths as ``seq_lens`` on the host (a CPU tensor or ints, e.g. from the
            engine's step inputs): with ``num_splits=None`` the split count and length come from them
            (:func:`choose_split_plan`) instead of the bound. Only sizes the launch: stale figures (a
            CUDA graph replayed with other lengths) cost speed, never correctness.
        split_len: tokens per split (a multiple of the config's ``block_n``), overriding the plan (tests,
            tuning); a sequence too long for ``num_splits`` splits of it is cut evenly instead.
        config: overrides :func:`choose_config` (tests, tuning).
        workspace: fp32 buffer of at least :func:`split_workspace_numel` elements on ``q``'s device for the
            split partials; default a cached one per shape.
        out: optional ``[num_seqs, num_q_heads, head_dim]`` tensor of ``q``'s dtype and device, last dim
            contiguous, to write into (every element is written); default a new contiguous tensor.

    Returns:
        ``out`` (``[num_seqs, num_q_heads, head_dim]``, the dtype of ``q``); softmax and accumulation in
        fp32 (dots in the cache dtype on CUDA, see module docstring).

    Raises:
        RuntimeError: triton is not installed.
        ValueError: on inconsistent shapes, dtypes, block size, ``out`` or a too small ``workspace``.
    """
    decode_kernel, combine_kernel = kernels()
    check_attention_heads(q, k_cache, v_cache)
    num_seqs, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    if q.dtype not in DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"q, k_cache, v_cache must share one dtype of fp32/bf16/fp16: "
            f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError("block_tables / seq_lens do not match the number of sequences in q")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("q, k_cache and v_cache need a contiguous last dimension")
    if block_tables.dtype != torch.int32 or block_tables.stride(1) != 1:
        block_tables = block_tables.to(torch.int32).contiguous()
    if seq_lens.dtype != torch.int32:
        seq_lens = seq_lens.to(torch.int32)

    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(2) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} on {q.device} with a contiguous last dim")
    if num_seqs == 0:
        return out
    group = num_q_heads // num_kv_heads
    num_sms, capability = _device_traits(q.device)
    cfg = config or choose_config(head_dim, group, q.dtype, capability)
    bound = block_tables.shape[1] * block_size
    if max_seq_len is not None:
        bound = min(bound, max_seq_len)
    max_tiles = max(1, -(-bound // cfg.block_n))
    if split_len is not None:
        if split_len <= 0 or split_len % cfg.block_n:
            raise ValueError(f"split_len must be a positive multiple of block_n {cfg.block_n}: {split_len}")
        if num_splits is None:
            num_splits = -(-bound // split_len)
    elif num_splits is None and seq_lens_host is not None:
        if len(seq_lens_host) != num_seqs:
            raise ValueError(f"seq_lens_host has {len(seq_lens_host)} lengths for {num_seqs} sequences")
        lens = seq_lens_host.tolist() if isinstance(seq_lens_host, torch.Tensor) else seq_lens_host
        num_splits, split_len = choose_split_plan(lens, num_kv_heads, cfg.block_n, num_sms)
    elif num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_tiles, num_sms)
    num_splits = max(1, min(num_splits, max_tiles, 256))  # the combine holds 256 x head_dim fp32 at most
    split_len = split_len or 0

    block_d = max(16, next_pow2(head_dim))
    upcast = q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and interpreted())
    consts = dict(
        GROUP=group,
        BLOCK_G=max(16, next_pow2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        UPCAST=upcast,
        IS_SPLIT=num_splits > 1,
    )
    strides = (
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_q_heads,
        num_splits,
        split_len,
    )
    key = (q.device, q.dtype, head_dim, group, num_splits > 1)
    grid = (num_seqs, num_kv_heads, num_splits)
    if num_splits == 1:
        args = (q, k_cache, v_cache, block_tables, seq_lens, out, out, out, out, *strides)
        _launch_decode(decode_kernel, grid, args, consts, cfg, key)
        return out

    parts = num_seqs * num_q_heads * num_splits
    numel = split_workspace_numel(num_seqs, num_q_heads, num_splits, head_dim)
    if workspace is None:  # sizes rounded up to a power of two: few distinct cached buffers
        workspace = _workspace(q.device, next_pow2(numel))
    elif workspace.dtype != torch.float32 or workspace.device != q.device or workspace.numel() < numel:
        raise ValueError(f"workspace must be fp32 on {q.device} with >= {numel} elements")
    ws = workspace.view(-1)
    part_acc = ws[: parts * head_dim]
    part_m = ws[parts * head_dim : parts * (head_dim + 1)]
    part_l = ws[parts * (head_dim + 1) : parts * (head_dim + 2)]
    args = (q, k_cache, v_cache, block_tables, seq_lens, out, part_m, part_l, part_acc, *strides)
    block_n = _launch_decode(decode_kernel, grid, args, consts, cfg, key)
    combine_kernel[(num_seqs, num_q_heads)](
        part_m,
        part_l,
        part_acc,
        out,
        seq_lens,
        out.stride(0),
        out.stride(1),
        num_splits,
        split_len,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_P=max(2, next_pow2(num_splits)),
        BLOCK_N=block_n,
        num_warps=4,
    )
    return out
