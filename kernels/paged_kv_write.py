"""Triton paged KV write: one program per token copies its key and value rows into their cache slot.

The GPU twin of :func:`~.paged_attention_ref.write_kv_cache` (vLLM's ``reshape_and_cache``, Kwon et al.
2023): one launch writes K and V of every token (two ``index_copy_`` otherwise), and a token whose slot is
``-1`` (the padding rows of a batch replayed as a CUDA graph of a larger bucket) writes nothing, with no host
sync, so the write can be captured in a CUDA graph.

As in :mod:`.paged_decode_attention`, triton is imported and the kernel decorated on the first call, never at
import (``TRITON_INTERPRET=1`` must be set before triton is first imported to run it on CPU tensors).
"""

from __future__ import annotations

import os

import torch

from omniduplex.kernels.paged_decode_attention import HAS_TRITON
from omniduplex.kernels.paged_shapes import check_kv_write

__all__ = ["write_kv_cache_triton"]

tl = None  # bound by _kernel() on first use
_compiled: dict[str, object] = {}


def _kv_write_kernel(
    k_ptr,  # [T, ROW] rows of this step's keys (row stride stride_k)
    v_ptr,
    k_cache_ptr,  # [num_slots, ROW] contiguous
    v_cache_ptr,
    slot_ptr,  # int64 [T]; -1 = skip
    stride_k,
    stride_v,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = (offs < ROW) & (slot >= 0)
    dst = tl.maximum(slot, 0) * ROW + offs
    k = tl.load(k_ptr + t.to(tl.int64) * stride_k + offs, mask=mask, other=0.0)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t.to(tl.int64) * stride_v + offs, mask=mask, other=0.0)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _kernel():
    """Import triton and jit the kernel on first use.

    Raises:
        RuntimeError: triton is missing, or ``TRITON_INTERPRET=1`` was set after triton was imported.
    """
    if not HAS_TRITON:
        raise RuntimeError("write_kv_cache_triton needs the `triton` package (pip install triton)")
    if not _compiled:
        import triton
        import triton.language as tl

        if os.environ.get("TRITON_INTERPRET") == "1" and type(tl.sum).__name__ != "InterpretedFunction":
            raise RuntimeError("TRITON_INTERPRET=1 was set after triton had been imported")
        globals()["tl"] = tl  # the kernel body reads the module's ``tl``
        _compiled["triton"] = triton
        _compiled["write"] = triton.jit(_kv_write_kernel)
    return _compiled["write"], _compiled["triton"]


def write_kv_cache_triton(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """:func:`~.paged_attention_ref.write_kv_cache` as one Triton launch (same arguments and contract: slot
    ``-1`` writes nothing; other slots must be valid, they are not checked on the device).

    Raises:
        ValueError: mismatched shapes or a non-contiguous cache.
        RuntimeError: triton is not installed.
    """
    _, _, num_kv_heads, head_dim = check_kv_write(k_cache, v_cache, k, v, slot_mapping)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    t = slot_mapping.shape[0]
    if t == 0:
        return
    kernel, triton = _kernel()
    row = num_kv_heads * head_dim
    # torch rounds a dtype cast to nearest even; Triton's interpreter truncates: cast here (models already
    # give K/V in the cache dtype, where this is no op)
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k = k if k.stride(2) == 1 and k.stride(1) == head_dim else k.contiguous()
    v = v if v.stride(2) == 1 and v.stride(1) == head_dim else v.contiguous()
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    kernel[(t,)](
        k, v, k_cache, v_cache, slots, k.stride(0), v.stride(0), ROW=row, BLOCK=triton.next_power_of_2(row)
    )
