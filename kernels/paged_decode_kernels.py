"""Triton kernels of the paged decode attention (one query per sequence), built for memory bandwidth, with
split-KV; the launcher and its policy are :mod:`.paged_decode_attention`.

Design (vLLM PagedAttention layout, Kwon et al. 2023, arXiv:2309.06180; FlashAttention-2 online softmax,
Dao 2023, arXiv:2307.08691; Flash-Decoding split-KV, Dao et al. 2023):

- One program per ``(sequence, KV head[, split])`` covering the whole GQA group of query heads that share
  the KV head (padded to ``BLOCK_G >= 16`` rows, the smallest ``tl.dot`` M), so each K/V byte is read once.
- Each loop iteration loads a tile of ``BLOCK_N`` tokens (64 for bf16 x 128: four whole 16-row KV blocks)
  straight from the block table: one block id per token (``pos // block_size``), row addresses
  ``block_id * stride_block + (pos % block_size) * stride_row``, each row ``head_dim`` contiguous elements,
  so loads are 16-byte vectors and 32 KiB of K+V are in flight per program per iteration; K and V are both
  issued before the first dot. Compiled (Triton 3.7.1, sm90): K/V tiles go to shared memory by ``cp.async``,
  the next tile's copy issued at the end of each iteration and the block ids two tiles ahead; dots are
  ``mma.sync`` (M = 16 is below wgmma's 64); 127 registers and 39 KiB of shared memory a program.
- Dots in the cache dtype on tensor cores with fp32 accumulation (bf16 x bf16 -> fp32; the softmax weights
  are rounded to the cache dtype for the P.V dot, as FlashAttention does); softmax statistics in fp32;
  fp32 caches use exact fp32 dots (``input_precision="ieee"``). Under the interpreter bf16 operands are
  up-cast to fp32 first: Triton 3.7's interpreter multiplies the raw uint16 bits of bf16 operands in
  ``tl.dot``; fp16 keeps the low-precision path there too, so CPU tests cover both code paths.
- Split-KV for small batches (Flash-Decoding; FlashInfer's decode plan): the launch grid has
  ``num_splits`` programs per ``(sequence, KV head)``. Two host-side sources size it, never device data:
  the REAL context lengths when the caller has them on the host (the engine's step inputs; eager steps):
  :func:`.paged_decode_config.choose_split_plan` picks one split length (``split_len`` tokens, whole tiles) so
  the batch's used programs make about one resident wave, short sequences use few splits and the grid has
  the longest one's count; else an UPPER BOUND of the length (``max_seq_len`` or the block-table width; a
  CUDA graph bucket's fixed bound): :func:`.paged_decode_config.choose_num_splits`, ``split_len = 0``, and
  each sequence's own tiles are cut evenly over the splits. Either way each program recomputes its range
  on the device from its sequence's length (``max(split_len / BLOCK_N, cdiv(tiles, num_splits))`` tiles a
  split), so the result never depends on the host's figures being right: any length, 0 or 1, is exact.
  Splits past a sequence's used count load no K/V and store nothing (a graph's padded splits cost a launch
  slot); a sequence with one used split stores its output directly; the others store ``(max, sum, acc)``
  in fp32 to a workspace reused across calls (keyed by size, or passed by the caller) and a combine kernel
  (one program per query head) merges only the used splits with the log-sum-exp rule. No host sync, no
  allocation sized by device data: the call can be captured in a CUDA graph. The epilogue is branch-free
  (masked stores): compiled for sm90, a runtime branch there cost ~35 registers and an early return ~15,
  which would drop the bf16 x 128 split kernel from 4 to 3 resident programs per SM (122 registers now).
- Tile sizes, ``num_warps`` and ``num_stages`` come from :func:`.paged_decode_config.choose_config`
  (pure; the launcher applies them); no ``@triton.autotune``. Triton is imported, and the kernels
  decorated, on the first call, never at import: ``TRITON_INTERPRET=1`` must be set before the first
  ``import triton`` of the process.

Bandwidth notes (bf16, 16 q / 8 KV heads x 128, block 16, batch 128 x 4096; to compare with what the GPU
measures with ``python3 -m omniduplex.benchmarks.bench_attention``):

- Bytes that must move: K+V = 2 x 128 x 4096 x 8 x 128 x 2 B = 2.147 GB (+ q, out 0.5 MB each, block
  table 0.13 MB). Floor: 0.72 ms at H100's ~3.0 TB/s copy rate, 0.50 ms at H200's ~4.3 TB/s (HBM peaks
  3.35 / 4.8 TB/s; cuDNN SDPA was measured at 4.58 TB/s on H200).
- Old design (one 16-token block per iteration, fp32 up-cast dots): 8 KiB in flight per program behind a
  block-id -> K -> dot -> V dependency chain, and fp32 FMA dots padded to 16 rows (34 GFLOP at this shape,
  ~0.5 ms of H100 fp32 FMA throughput on its own): measured 325 GB/s.
- Predicted for this design: 4 programs resident per SM (register-bound) with 32 KiB of K+V in flight each
  while waiting: ~100 KiB per SM, where Little's law needs ~25 KiB (3.35 TB/s x ~1 us / 132 SMs) ->
  bandwidth-bound; at the floor the bf16 dots (34 GFLOP, 16-row padded) use <10% of the mma.sync rate.
  Expect 2.4-2.8 TB/s on H100, 3.4-4.0 TB/s on H200 at 128 x 4096 (~75-85% of peak; padding the GQA group
  of 2 to 16 rows costs compute only). Waves: 1024 programs over 528 slots.
- Batch 8 x 4096 (134 MB, 45 us floor on H100): 64 programs x 8 splits = 512 (one wave), 8 tiles each
  -> ~2-2.5 TB/s; the combine adds one ~3 us kernel and 0.5 MB of partials.
- Batch 1 x 4096 (16.8 MB, 5.6 us floor): latency-bound; 64 splits of one tile + the combine kernel
  ~10-15 us of GPU time -> ~1.1-1.7 TB/s (cuDNN: 234 GB/s eager on H200, below).
- Measured eager on an H200 (2026-11-27, do_bench with the L2 flushed, host launch included): 91 GB/s at
  1 x 4096 (cuDNN 234), 786 at 8 x 4096 (2,060), 2,349 at 32 x 4096 (3,964), 4,239 at 128 x 4096
  (4,398). From the ratios, every split cell took ~170-230 us whatever its bytes (16.8-537 MB), while the
  unsplit 128 x 1024 (537 MB) took ~140 us: a fixed cost of the split path's two launches, not of the
  bytes; ``bench_attention`` now times both sides as CUDA graphs too (the engine's decode path, GPU time)
  and prints the host time per call, to tell the two apart.
- fp32 caches: exact fp32 FMA dots (4 FMA per K/V byte), 32-token tiles: ~1.5-2.5 TB/s at large batch.
"""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["HAS_TRITON", "LOG2E", "DTYPES", "kernels", "interpreted", "out_of_resources"]


def _triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["triton"] is None
        return False


HAS_TRITON = _triton_installed()
# Bound by _kernels() on first use: importing this module must not import triton (see module docstring).
triton = None
tl = None
LOG2E = 1.4426950408889634
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes the kernels take (``q`` and the cache of one of them)."""


def _paged_decode_kernel(
    q_ptr,  # [S, Hq, D]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, Hkv, D]
    v_cache_ptr,
    block_tables_ptr,  # int32 [S, max_blocks], unit stride along blocks
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
    num_q_heads,
    num_splits,
    split_len,  # tokens per split from the host plan (the real lengths), whole tiles; 0: even cut
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    IS_SPLIT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.maximum(tl.load(seq_lens_ptr + seq), 0)  # padding rows (<= 0): no tiles
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    # this sequence's own tiles cut on the device: the plan's split length, stretched if the grid has too
    # few splits for this length (so any length is exact whatever the host assumed)
    tiles_per_split = tl.maximum(tl.maximum(split_len // BLOCK_N, tl.cdiv(n_tiles, num_splits)), 1)
    used_splits = tl.maximum(tl.cdiv(n_tiles, tiles_per_split), 1)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, n_tiles)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_G, BLOCK_D]
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    for tile in range(tile_lo, tile_hi):
        pos = tile * BLOCK_N + offs_n  # [BLOCK_N] logical positions
        t_mask = pos < seq_len
        block_id = tl.load(bt_row + pos // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        row = pos % BLOCK_SIZE
        k_rows = block_id * stride_kb + row * stride_kt
        v_rows = block_id * stride_vb + row * stride_vt
        if HEAD_DIM == BLOCK_D:  # noqa: SIM108 (statement-level constexpr branches: plain Triton)
            kv_mask = t_mask[:, None]
        else:
            kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))  # cache dtype on tensor cores, fp32 accumulator
        s = tl.where(t_mask[None, :], s * qk_scale, float("-inf"))  # [BLOCK_G, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every visited tile has a valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if UPCAST:  # noqa: SIM108
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    # Branch-free epilogue (a runtime branch here costs ~35 registers, an early return ~15: fewer resident
    # programs): a padded split (past this sequence's used ones) stores nothing; a sequence with one used
    # split stores its final output (the combine skips it), the others their partials.
    direct = (used_splits == 1) & (split == 0)
    if IS_SPLIT:
        part = (seq * num_q_heads + heads) * num_splits + split  # [BLOCK_G]
        part_mask = g_mask & (split < used_splits) & (used_splits > 1)
        tl.store(part_m_ptr + part, m_i, mask=part_mask)
        tl.store(part_l_ptr + part, l_i, mask=part_mask)
        acc_ptrs = part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(acc_ptrs, acc, mask=part_mask[:, None] & out_mask)
        out_mask = out_mask & direct
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # seq_len == 0 -> zeros
    tl.store(
        out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=out_mask,
    )


def _split_combine_kernel(
    part_m_ptr,  # fp32 [S, Hq, P]
    part_l_ptr,  # fp32 [S, Hq, P]
    part_acc_ptr,  # fp32 [S, Hq, P, D]
    out_ptr,  # [S, Hq, D]
    seq_lens_ptr,  # int32 [S]
    stride_os,
    stride_oh,
    num_splits,
    split_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    n_tiles = tl.cdiv(tl.maximum(tl.load(seq_lens_ptr + seq), 0), BLOCK_N)  # the decode kernel's split rule
    tiles_per_split = tl.maximum(tl.maximum(split_len // BLOCK_N, tl.cdiv(n_tiles, num_splits)), 1)
    used_splits = tl.cdiv(n_tiles, tiles_per_split)
    if used_splits <= 1:  # the decode kernel wrote this row's output itself
        return
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.arange(0, BLOCK_D)
    p_mask = offs_p < used_splits
    base = (seq * tl.num_programs(1) + head) * num_splits
    m = tl.load(part_m_ptr + base + offs_p, mask=p_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + base + offs_p, mask=p_mask, other=0.0)
    acc = tl.load(
        part_acc_ptr + (base + offs_p)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=p_mask[:, None] & (offs_d < HEAD_DIM)[None, :],
        other=0.0,
    )  # [BLOCK_P, BLOCK_D]
    m_max = tl.max(m, 0)  # finite: every used split holds a valid token
    w = tl.exp2(m - m_max)  # masked lanes: exp2(-inf) = 0
    l_sum = tl.sum(l * w, 0)
    out = tl.sum(acc * w[:, None], 0) / l_sum
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


_compiled: dict[str, object] = {}


def kernels():
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
        _compiled["interpreted"] = interpreted
        _compiled["decode"] = triton.jit(_paged_decode_kernel)
        _compiled["combine"] = triton.jit(_split_combine_kernel)
    return _compiled["decode"], _compiled["combine"]


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``); after :func:`kernels`."""
    return bool(_compiled.get("interpreted"))


def out_of_resources() -> type[Exception]:
    """Triton's ``OutOfResources`` (a launch needing more shared memory than the GPU has); after
    :func:`kernels`."""
    return triton.runtime.errors.OutOfResources
