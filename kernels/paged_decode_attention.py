"""Triton paged decode attention (one query per sequence), built for memory bandwidth, with split-KV.

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
- Split-KV for small batches: the launch grid has ``num_splits`` programs per ``(sequence, KV head)``,
  chosen on the host from the batch shape and an UPPER BOUND of the sequence length (``max_seq_len`` or the
  block-table width; the seed's Fish Speech "upper bound" dispatch), never from device data. Each program
  then cuts its own sequence's tiles evenly on the device (``cdiv(cdiv(seq_len, BLOCK_N), num_splits)``
  tiles per split), so any sequence shorter than the bound, of length 0 or 1, or with empty splits is
  handled, and the result never depends on the bound being tight. Each split writes ``(max, sum, acc)``
  in fp32 to a workspace reused across calls (keyed by shape, or passed by the caller) and a combine
  kernel merges them with the log-sum-exp rule. No host sync, no allocation sized by device data: the call
  can be captured in a CUDA graph.
- Tile sizes, ``num_warps`` and ``num_stages`` come from :func:`.paged_decode_config.choose_config`
  (pure); no ``@triton.autotune``. Triton is imported, and the kernels decorated, on the first call, never
  at import: ``TRITON_INTERPRET=1`` must be set before the first ``import triton`` of the process.

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
  ~10-15 us -> ~1.1-1.7 TB/s (cuDNN measured 675 GB/s on H200).
- fp32 caches: exact fp32 FMA dots (4 FMA per K/V byte), 32-token tiles: ~1.5-2.5 TB/s at large batch.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import replace

import torch

from omniduplex.kernels.paged_decode_config import (
    DecodeConfig,
    choose_config,
    choose_num_splits,
    next_pow2,
    split_workspace_numel,
)

__all__ = [
    "HAS_TRITON",
    "DecodeConfig",
    "fits_triton_decode",
    "choose_config",
    "choose_num_splits",
    "paged_decode_attention_triton",
    "split_workspace_numel",
]


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
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
    seq_len = tl.load(seq_lens_ptr + seq)
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.cdiv(n_tiles, num_splits)  # this sequence's own tiles, cut on the device
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
    if IS_SPLIT:
        part = (seq * num_q_heads + heads) * num_splits + split  # [BLOCK_G]
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


def _split_combine_kernel(
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
    seq = tl.program_id(0).to(tl.int64)
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
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # every split empty (seq_len == 0)
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
        _compiled["interpreted"] = interpreted
        _compiled["decode"] = triton.jit(_paged_decode_kernel)
        _compiled["combine"] = triton.jit(_split_combine_kernel)
    return _compiled["decode"], _compiled["combine"]


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
    return q.dtype in _DTYPES and k_cache.dtype == q.dtype


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


def _launch_decode(kernel, grid, args, consts: dict, cfg: DecodeConfig, key: tuple) -> None:
    """Launch with ``cfg``; if the compiled kernel needs more shared memory than the GPU has (Triton's
    ``OutOfResources``, raised by the first launch of a shape), retry once without pipelining and with half
    the tile, and keep that config for ``key``."""
    cfg = _degraded.get(key, cfg)
    try:
        kernel[grid](*args, **consts, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    except triton.runtime.errors.OutOfResources:
        cfg = _degraded[key] = replace(cfg, block_n=max(16, cfg.block_n // 2), num_stages=1)
        kernel[grid](*args, **consts, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


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
        num_splits: split-KV factor; ``None`` picks one with :func:`choose_num_splits`, 1 forces the single
            pass, ``> 1`` the split + combine (clamped to the number of tiles of the bound).
        max_seq_len: host-side upper bound of ``seq_lens`` (a CUDA-graph bucket's bound); only sizes the
            split count, so a bound that is too small costs speed, never correctness. Default: the
            block-table width. No device-to-host sync either way.
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
    decode_kernel, combine_kernel = _kernels()
    num_seqs, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, kv_dim = k_cache.shape
    if kv_dim != head_dim or num_q_heads % num_kv_heads or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"incompatible shapes: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
            f"v_cache {tuple(v_cache.shape)}"
        )
    if q.dtype not in _DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
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
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_tiles, num_sms)
    num_splits = max(1, min(num_splits, max_tiles))

    block_d = max(16, next_pow2(head_dim))
    upcast = q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and _compiled["interpreted"])
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
        num_q_heads,
        num_splits,
    )
    key = (q.device, q.dtype, head_dim, group, num_splits > 1)
    grid = (num_seqs, num_kv_heads, num_splits)
    if num_splits == 1:
        args = (q, k_cache, v_cache, block_tables, seq_lens, out, out, out, out, *strides)
        _launch_decode(decode_kernel, grid, args, consts, cfg, key)
        return out

    parts = num_seqs * num_q_heads * num_splits
    numel = split_workspace_numel(num_seqs, num_q_heads, num_splits, head_dim)
    if workspace is None:
        workspace = _workspace(q.device, numel)
    elif workspace.dtype != torch.float32 or workspace.device != q.device or workspace.numel() < numel:
        raise ValueError(f"workspace must be fp32 on {q.device} with >= {numel} elements")
    ws = workspace.view(-1)
    part_acc = ws[: parts * head_dim]
    part_m = ws[parts * head_dim : parts * (head_dim + 1)]
    part_l = ws[parts * (head_dim + 1) : parts * (head_dim + 2)]
    args = (q, k_cache, v_cache, block_tables, seq_lens, out, part_m, part_l, part_acc, *strides)
    _launch_decode(decode_kernel, grid, args, consts, cfg, key)
    combine_kernel[(num_seqs, num_q_heads)](
        part_m,
        part_l,
        part_acc,
        out,
        out.stride(0),
        out.stride(1),
        num_splits,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_P=max(2, next_pow2(num_splits)),
        num_warps=4,
    )
    return out
