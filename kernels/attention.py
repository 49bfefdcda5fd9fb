"""Paged attention dispatcher: a decode kernel where one applies (Triton on CUDA, our C++ one on CPU), the
torch path elsewhere.

Selection (``OMNIDUPLEX_ATTENTION_BACKEND`` unset or ``auto``), for batches where every query length is 1:
the Triton decode kernel when ``q`` is on CUDA and Triton is importable (``q`` and the cache of one dtype of
fp32/bf16/fp16; ``max_seq_len`` is passed on as the kernel's host-side upper bound, so the call never syncs
and can be captured in a CUDA graph); the C++ decode kernel
(:mod:`.cpu_ops`) when ``q`` is on the CPU and the kernels are loaded (a model prepared for CPU serving,
:func:`.cpu_linear.prepack_linears`, loads them). Otherwise, and for every batch with a longer query (prefill
chunks), :func:`paged_attention_torch`.

The q_len = 1 fast path (:func:`gqa_decode`, our C++ ``paged_decode_gqa`` of ``csrc/decode_gqa.cpp``) is
opt-in per model (:func:`set_decode_fast_path`): a decode-only CPU batch whose head size, GQA group and block
size it was built for runs one work item per (sequence, KV head) over the group's query heads, each block's
K and V rows read once in one online-softmax pass; any other batch falls back to the dispatcher below.
:func:`time_decode_attention` measures the decode-only attention calls of a model's layers (both paths).

``OMNIDUPLEX_ATTENTION_BACKEND=torch`` always takes the torch path. ``=triton`` sends every decode-only
batch to the Triton kernel and raises if it cannot run (Triton missing, or ``q`` on CPU without
``TRITON_INTERPRET=1``); ``=cpp`` sends every decode-only CPU batch to the C++ kernel (building it if need
be); batches with a query longer than 1 still take the torch path, since there is no prefill kernel.

The paged KV write (:func:`write_kv_cache`) is one Triton launch on CUDA where Triton is importable (unless
the variable says ``torch``), :func:`~.paged_attention_ref.write_kv_cache` elsewhere; both skip slot ``-1``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache

import torch

from omniduplex.kernels import cpu_ops
from omniduplex.kernels.paged_attention_ref import paged_attention_torch
from omniduplex.kernels.paged_attention_ref import write_kv_cache as write_kv_cache_torch
from omniduplex.kernels.paged_decode_attention import (
    HAS_TRITON,
    fits_triton_decode,
    paged_decode_attention_triton,
)
from omniduplex.kernels.paged_kv_write import write_kv_cache_triton

__all__ = [
    "BACKEND_ENV",
    "DecodeTimer",
    "decode_timer",
    "gqa_decode",
    "paged_attention",
    "select_backend",
    "set_decode_fast_path",
    "time_decode_attention",
    "write_kv_cache",
]

BACKEND_ENV = "OMNIDUPLEX_ATTENTION_BACKEND"


def select_backend(device: torch.device, decode_only: bool) -> str:
    """Return ``"triton"``, ``"cpp"`` or ``"torch"`` for a batch on ``device`` (see module docstring).

    Raises:
        ValueError: unknown value of ``OMNIDUPLEX_ATTENTION_BACKEND``.
        RuntimeError: ``triton`` or ``cpp`` forced for a decode batch where it cannot run.
        omniduplex.kernels.cpu_ops.CpuOpsBuildError: ``cpp`` forced and the C++ kernels cannot be built.
    """
    forced = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if forced not in ("auto", "torch", "triton", "cpp"):
        raise ValueError(f"{BACKEND_ENV}={forced!r}; expected torch, triton, cpp or auto")
    if forced == "torch" or not decode_only:
        return "torch"
    if forced == "auto":
        if device.type == "cuda":
            return "triton" if HAS_TRITON else "torch"
        return "cpp" if device.type == "cpu" and cpu_ops.loaded() else "torch"
    if forced == "cpp":
        if device.type != "cpu":
            raise RuntimeError(f"{BACKEND_ENV}=cpp needs CPU tensors, not {device.type}")
        cpu_ops.load()
        return "cpp"
    if not HAS_TRITON:
        raise RuntimeError(f"{BACKEND_ENV}=triton but triton is not installed")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{BACKEND_ENV}=triton on {device.type} needs TRITON_INTERPRET=1 (tests only)")
    return "triton"


def write_kv_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` ``[T, Hkv, D]`` into the paged caches at ``slot_mapping`` (``-1``: skip), in place:
    :func:`~.paged_kv_write.write_kv_cache_triton` on CUDA with Triton, else
    :func:`~.paged_attention_ref.write_kv_cache` (arguments, contract and errors as there)."""
    if k_cache.device.type == "cuda" and HAS_TRITON and os.environ.get(BACKEND_ENV, "").strip() != "torch":
        write_kv_cache_triton(k_cache, v_cache, k, v, slot_mapping)
    else:
        write_kv_cache_torch(k_cache, v_cache, k, v, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int | None = None,
    max_query_len: int | None = None,
    is_decode_only: bool | None = None,
    seq_lens_host: Sequence[int] | None = None,
) -> torch.Tensor:
    """Causal attention of a flat query batch over the paged KV cache, on the best available backend.

    Shapes and dtypes as in :func:`~omniduplex.kernels.paged_attention_ref.paged_attention_torch`:
    ``q [num_tokens, num_q_heads, head_dim]``, caches ``[num_blocks, 16, num_kv_heads, head_dim]``,
    int32 ``block_tables [num_seqs, max_blocks]``, ``seq_lens [num_seqs]``, ``query_start_loc
    [num_seqs + 1]``; returns ``[num_tokens, num_q_heads, head_dim]`` in the dtype of ``q``.

    Args:
        max_seq_len, max_query_len: host-side bounds that spare device-to-host syncs.
        seq_lens_host: ``seq_lens`` as host ints when the caller has them: the Triton decode kernel then
            sizes its split-KV from the real lengths (FlashInfer-style plan), not from ``max_seq_len``.
        is_decode_only: ``True`` promises every query length is 1 (then ``num_tokens == num_seqs``).
            When ``None`` it is inferred from ``max_query_len``, from ``num_tokens != num_seqs``, and
            only as a last resort from ``query_start_loc`` (a device-to-host sync; pass a hint on GPU).

    Raises:
        ValueError / RuntimeError: from :func:`select_backend` or the chosen implementation.
    """
    num_tokens, num_seqs = q.shape[0], seq_lens.shape[0]
    if is_decode_only is None:
        if num_tokens != num_seqs:
            is_decode_only = False
        elif max_query_len is not None:
            is_decode_only = max_query_len == 1
        else:
            is_decode_only = bool((query_start_loc[1:] - query_start_loc[:-1] == 1).all())
    if is_decode_only:
        max_query_len = 1
    backend = select_backend(q.device, is_decode_only)
    if backend == "triton" and fits_triton_decode(q, k_cache):
        return paged_decode_attention_triton(
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            scale,
            max_seq_len=max_seq_len,
            seq_lens_host=seq_lens_host,
        )
    if backend == "cpp" and cpu_ops.fits_decode_kernel(q, k_cache):
        decode = torch.ops.omniduplex_cpu.paged_decode_attention
        return decode(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return paged_attention_torch(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_seq_len, max_query_len
    )


@lru_cache(maxsize=64)
def _gqa_fits(head_dim: int, num_q_heads: int, num_kv_heads: int, block: int) -> bool:
    return bool(torch.ops.omniduplex_cpu.gqa_decode_fits(head_dim, num_q_heads, num_kv_heads, block))


def gqa_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor | None:
    """The q_len = 1 decode fast path: ``q`` ``[S, Hq, D]`` (one query per sequence) over the paged cache
    → ``[S, Hq, D]`` in the dtype of ``q``, or ``None`` when the batch is outside its shape (the caller falls
    back): CPU tensors of one dtype (fp32, bf16, fp16), the C++ ops loaded, 16-row blocks, ``D`` of 1, 2, 4,
    8 or 16 fp32 vectors (AVX-512: 16, 32, 64, 128, 256; AVX2: 8 .. 128) and a GQA group ``Hq / Hkv`` of 1, 2,
    4 or 8. One work item per (sequence, KV head): the group's queries share each K/V row, read once, in one
    pass with an online softmax (FlashAttention's decode form, Dao et al. 2022); fp32 accumulation.

    Raises:
        RuntimeError: a block table entry outside the cache or a ``seq_len`` outside ``[1, capacity]``.
    """
    if (
        q.device.type != "cpu"
        or q.shape[0] != seq_lens.shape[0]
        or k_cache.dtype != q.dtype
        or v_cache.dtype != q.dtype
        or not cpu_ops.loaded()
        or not _gqa_fits(q.shape[2], q.shape[1], k_cache.shape[2], k_cache.shape[1])
    ):
        return None
    return torch.ops.omniduplex_cpu.paged_decode_gqa(q, k_cache, v_cache, block_tables, seq_lens, scale)


def set_decode_fast_path(model: torch.nn.Module, on: bool) -> int:
    """Route the decode-only attention of ``model``'s layers (modules with a ``decode_fast_path`` attribute)
    through :func:`gqa_decode` (``on``) or the dispatcher; returns the number of layers switched. With ``on``
    the C++ ops are loaded first where they build (:func:`.cpu_ops.available`)."""
    if on and not cpu_ops.available():
        on = False
    n = 0
    for mod in model.modules():
        if hasattr(mod, "decode_fast_path"):
            mod.decode_fast_path = on
            n += 1
    return n


class DecodeTimer:
    """Wall time of decode-only attention calls (``with timer:`` around each); ``seconds``, ``calls``."""

    def __init__(self) -> None:
        self.seconds, self.calls, self._t0 = 0.0, 0, 0.0

    def __enter__(self) -> DecodeTimer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1


_timer: DecodeTimer | None = None


def decode_timer() -> DecodeTimer | None:
    """The timer of an active :func:`time_decode_attention` block, else ``None`` (then nothing is timed)."""
    return _timer


@contextmanager
def time_decode_attention() -> Iterator[DecodeTimer]:
    """Within the block, every decode-only attention call of a model layer (one query per sequence; the
    fast path or the dispatcher) is timed into the yielded :class:`DecodeTimer`. Not thread-safe: one
    engine thread at a time."""
    global _timer
    prev, _timer = _timer, DecodeTimer()
    try:
        yield _timer
    finally:
        _timer = prev
