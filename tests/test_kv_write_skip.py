"""The paged KV write skips slot -1 (the padding rows of a batch replayed as a CUDA graph of a larger
bucket) on every path: the torch path on the CPU, its sync-free form (what runs on a GPU without Triton), the
Triton kernel (interpreted on CPU tensors; compiled on a GPU) and our C++ op. Rows outside the written slots
stay unchanged.

With ``TRITON_INTERPRET=0`` exported and CUDA present, the Triton and sync-free cases run on the GPU."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from omniduplex.kernels import cpu_ops  # noqa: E402
from omniduplex.kernels.paged_attention_ref import _write_skipping, write_kv_cache  # noqa: E402
from omniduplex.kernels.paged_decode_attention import HAS_TRITON  # noqa: E402
from omniduplex.kernels.paged_kv_write import write_kv_cache_triton  # noqa: E402

BLOCK = 16
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"
CASES = {
    "mixed": [5, -1, 33, -1, 60, 2],
    "padding first": [-1, -1, 18, 3],
    "all padding": [-1, -1, -1],
    "none": [0, 63, 17],
    "slot 0 beside padding": [0, -1, 9],
}


def _case(slots: list[int], dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(4, BLOCK, 2, 8, generator=g).to(dtype).to(DEVICE)
    v_cache = torch.randn(4, BLOCK, 2, 8, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(len(slots), 2, 8, generator=g).to(DEVICE)  # fp32: cast to the cache dtype
    v = torch.randn(len(slots), 2, 8, generator=g).to(DEVICE)
    return k_cache, v_cache, k, v, torch.tensor(slots, dtype=torch.int64, device=DEVICE)


def _expected(k_cache, v_cache, k, v, slots):
    """A per-row loop: rows with a slot >= 0 written, everything else as it was."""
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            want_k[s // BLOCK, s % BLOCK] = k[i].to(want_k.dtype)
            want_v[s // BLOCK, s % BLOCK] = v[i].to(want_v.dtype)
    return want_k, want_v


def _flat_write(k_cache, v_cache, k, v, slots):
    flat = (-1, k_cache.shape[2], k_cache.shape[3])
    _write_skipping(k_cache.view(flat), v_cache.view(flat), k, v, slots)


WRITERS = {"torch": write_kv_cache, "sync-free torch": _flat_write}
if HAS_TRITON:
    WRITERS["triton"] = write_kv_cache_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_padding_slots_write_nothing(writer, case, dtype):
    k_cache, v_cache, k, v, slots = _case(CASES[case], dtype)
    want_k, want_v = _expected(k_cache, v_cache, k, v, slots)
    WRITERS[writer](k_cache, v_cache, k, v, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_int32_slots_and_strided_rows_through_triton():
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    k_cache, v_cache, k, v, slots = _case([7, -1, 40], torch.float32, seed=1)
    want_k, want_v = _expected(k_cache, v_cache, k, v, slots)
    qkv = torch.cat((k.reshape(3, -1), v.reshape(3, -1)), dim=1)  # k, v as views of one projection
    k_view, v_view = qkv[:, :16].view(3, 2, 8), qkv[:, 16:].view(3, 2, 8)
    write_kv_cache_triton(k_cache, v_cache, k_view, v_view, slots.to(torch.int32))
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_cpp_op_skips_padding_and_still_rejects_other_negatives():
    if not cpu_ops.available():
        pytest.skip("the C++ kernels cannot be built here")
    cpu_ops.load()
    ops = torch.ops.omniduplex_cpu
    dev_slots = CASES["mixed"]
    global DEVICE
    saved, DEVICE = DEVICE, "cpu"
    try:
        k_cache, v_cache, k, v, slots = _case(dev_slots, torch.bfloat16)
    finally:
        DEVICE = saved
    want_k, want_v = _expected(k_cache, v_cache, k, v, slots)
    ops.write_kv_cache(k_cache, v_cache, k, v, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    before = k_cache.clone()
    with pytest.raises(RuntimeError, match="slot_mapping\\[1\\] = -2"):
        ops.write_kv_cache(k_cache, v_cache, k[:2], v[:2], torch.tensor([3, -2]))
    assert torch.equal(k_cache, before)
