"""Triton paged decode attention (one query per sequence) with an optional split-KV pass.

Work split: one program per ``(sequence, kv head[, split])``. The program loads the whole GQA group of
query heads that share the KV head (padded to ``BLOCK_G >= 16`` rows so ``tl.dot`` is legal on tensor
cores), so every K/V block is read from memory once per group rather than once per query head. It walks
the block table one KV block (16 tokens) at a time with the FlashAttention-2 online softmax (running max
and sum, fp32 accumulator; Dao 2023, arXiv:2307.08691) over the vLLM PagedAttention layout (Kwon et al.
2023, arXiv:2309.06180).

Split-KV (FlashDecoding, Dao et al. 2023, "Flash-Decoding for long-context inference"): when there are
too few ``(sequence, kv head)`` programs to fill the GPU, each sequence is cut into ``num_splits``
chunks of ``blocks_per_split`` KV blocks; each chunk program writes a partial ``(max, sum, acc)`` and a
second kernel merges the partials with the log-sum-exp rule.

Precision: q, K and V tiles are up-cast to fp32 in registers and both dots run in fp32
(``input_precision="ieee"``, no TF32, no bf16 rounding of the softmax weights). Decode reads each K/V
element once per GQA group, so it stays memory-bound and the fp32 dots cost little; it also keeps the
interpreter exact (Triton 3.7's interpreter multiplies the raw uint16 bits of bf16 operands in
``tl.dot``).

Triton is imported, and the kernels are decorated, on the first call, never at import. ``triton.jit``
decides at decoration time whether a function is interpreted, and triton's own library functions
(``tl.sum``, ``tl.max``, ...) are decorated when ``triton`` is first imported, so ``TRITON_INTERPRET=1``
must be set before the first ``import triton`` in the process; importing ``omniduplex.kernels`` does not
import triton. No ``@triton.autotune``: fixed configs, which also run under the interpreter. The module
imports without Triton; calling the kernel then raises ``RuntimeError``.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

__all__ = ["HAS_TRITON", "choose_num_splits", "paged_decode_attention_triton"]


def _triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["triton"] is None
        return False


HAS_TRITON = _triton_installed()
# Bound by _kernels() on first use: importing this module must not import triton (see module docstring).
triton = None
tl = None
_LOG2E = 1.4426950408889634
_NUM_WARPS = 4


def _paged_decode_kernel(
    q_ptr,  # [S, Hq, D]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, Hkv, D]
    v_cache_ptr,
    block_tables_ptr,  # int32 [S, max_blocks]
    seq_lens_ptr,  # int32 [S]
    out_ptr,  # [S, Hq, D] (single pass) or unused
    part_m_ptr,  # fp32 [S, Hq, P] running max in log2 units (split) or unused
    part_l_ptr,  # fp32 [S, Hq, P] running sum
    part_acc_ptr,  # fp32 [S, Hq, P, D] unnormalised output
    qk_scale,  # softmax scale * log2(e)
    stride_qs,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    stride_os,
    stride_oh,
    num_splits,
    blocks_per_split,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    blk_lo = split * blocks_per_split
    blk_hi = tl.minimum(blk_lo + blocks_per_split, tl.cdiv(seq_len, BLOCK_SIZE))

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, BLOCK_SIZE)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_G, BLOCK_D]

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    kv_off = kv_head * stride_kh + offs_t[:, None] * stride_kt + offs_d[None, :]
    v_off = kv_head * stride_vh + offs_t[:, None] * stride_vt + offs_d[None, :]
    for blk in range(blk_lo, blk_hi):
        block_id = tl.load(block_tables_ptr + seq * stride_bt + blk).to(tl.int64)
        t_mask = blk * BLOCK_SIZE + offs_t < seq_len
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + block_id * stride_kb + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # [BLOCK_G, BLOCK_SIZE]
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every visited block has a valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + block_id * stride_vb + v_off, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if IS_SPLIT:
        part = (seq * (tl.num_programs(1) * GROUP) + heads) * num_splits + split  # [BLOCK_G]
        tl.store(part_m_ptr + part, m_i, mask=g_mask)
        tl.store(part_l_ptr + part, l_i, mask=g_mask)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)
    else:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # seq_len == 0 -> zeros
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


def _split_reduce_kernel(
    part_m_ptr,  # fp32 [S, Hq, P]
    part_l_ptr,  # fp32 [S, Hq, P]
    part_acc_ptr,  # fp32 [S, Hq, P, D]
    out_ptr,  # [S, Hq, D]
    stride_os,
    stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.arange(0, BLOCK_D)
    p_mask = offs_p < num_splits
    base = (seq * tl.num_programs(1) + head) * num_splits
    m = tl.load(part_m_ptr + base + offs_p, mask=p_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + base + offs_p, mask=p_mask, other=0.0)
    acc = tl.load(
        part_acc_ptr + (base + offs_p)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=p_mask[:, None] & (offs_d < HEAD_DIM)[None, :],
        other=0.0,
    )  # [BLOCK_P, BLOCK_D]
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty (seq_len == 0)
    w = tl.exp2(m - m_max)  # empty splits: exp2(-inf) = 0
    l_sum = tl.sum(l * w, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(l_sum > 0.0, l_sum, 1.0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


_compiled: dict[str, object] = {}


def _kernels():
    """Import triton and ``triton.jit`` the kernels on first use (see module docstring).

    Raises:
        RuntimeError: triton is missing, or ``TRITON_INTERPRET=1`` was set after triton was imported.
    """
    global triton, tl
    if not HAS_TRITON:
        raise RuntimeError(
            "paged_decode_attention_triton needs the `triton` package (pip install triton); "
            "use omniduplex.kernels.paged_attention, which falls back to the torch path"
        )
    if not _compiled:
        import triton as triton_module
        import triton.language as tl_module

        interpreted = type(tl_module.sum).__name__ == "InterpretedFunction"
        if os.environ.get("TRITON_INTERPRET") == "1" and not interpreted:
            raise RuntimeError(
                "TRITON_INTERPRET=1 was set after triton had been imported, so triton's own jit "
                "functions (tl.sum, tl.max, ...) are not interpretable; set it before anything "
                "imports triton (for tests: at the top of tests/conftest.py)"
            )
        triton, tl = triton_module, tl_module
        _compiled["decode"] = triton.jit(_paged_decode_kernel)
        _compiled["reduce"] = triton.jit(_split_reduce_kernel)
    return _compiled["decode"], _compiled["reduce"]


def choose_num_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_blocks: int,
    num_sms: int,
    *,
    min_blocks_per_split: int = 8,
    max_splits: int = 32,
) -> int:
    """Pick the split-KV factor (FlashDecoding) so that ``num_seqs * num_kv_heads * splits`` programs
    give about two waves on ``num_sms`` streaming multiprocessors.

    Returns 1 (single pass) when the batch already fills the device or sequences are short; otherwise
    at most ``max_splits`` and never fewer than ``min_blocks_per_split`` KV blocks per split. Pure.
    """
    programs = max(num_seqs * num_kv_heads, 1)
    target = 2 * max(num_sms, 1)
    if programs >= target:
        return 1
    by_occupancy = -(-target // programs)
    by_length = max_blocks // min_blocks_per_split
    return max(1, min(by_occupancy, by_length, max_splits))


@functools.cache
def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; CPU cores for the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return os.cpu_count() or 1


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
) -> torch.Tensor:
    """Decode attention (one query per sequence) over the paged KV cache.

    Args:
        q: ``[num_seqs, num_q_heads, head_dim]``, fp32/bf16/fp16, last dim contiguous.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, dtype of ``q``, last dim
            contiguous; ``block_size`` a power of two ``>= 16``.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``, row-contiguous.
        seq_lens: int32 ``[num_seqs]``, cached tokens including this step's; the query sits at position
            ``seq_len - 1`` and attends to ``0..seq_len - 1``. ``seq_len == 0`` yields zeros.
        scale: softmax scale, usually ``head_dim ** -0.5``.
        num_splits: split-KV factor; ``None`` picks one with :func:`choose_num_splits`, 1 forces the single
            pass, ``> 1`` the FlashDecoding split + reduce.
        max_seq_len: optional host-side bound on ``seq_lens`` (tightens the split size); without it the
            block-table width is used, so there is no device-to-host sync either way.

    Returns:
        ``[num_seqs, num_q_heads, head_dim]`` in the dtype of ``q``; softmax and accumulation in fp32.

    Raises:
        RuntimeError: triton is not installed.
        ValueError: on inconsistent shapes, dtypes or block size.
    """
    decode_kernel, reduce_kernel = _kernels()
    num_seqs, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, kv_dim = k_cache.shape
    if kv_dim != head_dim or num_q_heads % num_kv_heads or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"incompatible shapes: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
            f"v_cache {tuple(v_cache.shape)}"
        )
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"dtype mismatch: q {q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if block_tables.shape[0] != num_seqs or seq_lens.shape[0] != num_seqs:
        raise ValueError("block_tables / seq_lens do not match the number of sequences in q")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("q, k_cache and v_cache need a contiguous last dimension")
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32)

    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    max_blocks = block_tables.shape[1]
    if max_seq_len is not None:
        max_blocks = min(max_blocks, -(-max_seq_len // block_size))
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_blocks, _num_sms(q.device))
    num_splits = max(1, min(num_splits, max(max_blocks, 1)))
    blocks_per_split = -(-max_blocks // num_splits)

    group = num_q_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    consts = dict(
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        num_warps=_NUM_WARPS,
    )
    args = (
        scale * _LOG2E,
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
        num_splits,
        blocks_per_split,
    )
    if num_splits == 1:
        decode_kernel[(num_seqs, num_kv_heads, 1)](
            q, k_cache, v_cache, block_tables, seq_lens, out, out, out, out, *args, IS_SPLIT=False, **consts
        )
        return out

    part_m = torch.empty(num_seqs, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(num_seqs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_m,
        part_l,
        part_acc,
        *args,
        IS_SPLIT=True,
        **consts,
    )
    reduce_kernel[(num_seqs, num_q_heads)](
        part_m,
        part_l,
        part_acc,
        out,
        out.stride(0),
        out.stride(1),
        num_splits,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_P=max(2, triton.next_power_of_2(num_splits)),
        num_warps=_NUM_WARPS,
    )
    return out
