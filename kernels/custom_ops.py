"""Paged attention, the paged KV write and the MoE expert dispatch as registered torch custom ops.

``torch.compile`` cannot trace into the paged-attention dispatcher (host-side branching on batch shape) or
the MoE dispatch (per-expert row counts read on the host): traced as Python they break the graph once per
layer. Registered as ops with shape functions ("fake" kernels), they are single opaque nodes, so a whole
decoder forward compiles to one graph (vLLM registers its attention the same way,
``vllm.utils.direct_register_custom_op``). The layers call these ops only while being compiled
(``torch.compiler.is_compiling()``); eager calls go straight to the Python functions and skip the
dispatcher.

The ops are defined on a :class:`torch.library.Library` directly (schema inferred from the Python signature,
the function as the kernel for every backend), as vLLM's ``direct_register_custom_op`` does, not with the
``torch.library.custom_op`` decorator, whose Python wrapper cost ~14 µs per call here against ~2 µs — a
decode step calls these ops ~40-60 times.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.library import Library, infer_schema, register_fake

from omniduplex.kernels import cpu_linear
from omniduplex.kernels.attention import paged_attention, write_kv_cache
from omniduplex.kernels.moe import moe_experts

_LIB = Library("omniduplex", "FRAGMENT")


def _register(name: str, fake: Callable, mutates_args: tuple[str, ...] = ()) -> Callable:
    """Decorator: define ``omniduplex::<name>`` with the decorated function as its kernel and ``fake`` as its
    shape function; returns the op (``torch.ops.omniduplex.<name>.default``)."""

    def wrap(fn: Callable) -> Callable:
        # this module can be imported a second time under another name (from a source checkout,
        # transformers' probe for a ``kernels`` package imports our top-level ``kernels/``): define once
        if not hasattr(torch.ops.omniduplex, name):
            _LIB.define(name + infer_schema(fn, mutates_args=mutates_args))
            _LIB.impl(name, fn, "CompositeExplicitAutograd")
            register_fake(f"omniduplex::{name}", fake, lib=_LIB)
        return getattr(torch.ops.omniduplex, name).default

    return wrap


def _paged_attention_fake(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_seq_len, max_query_len
):
    return torch.empty_like(q)


@_register("paged_attention", _paged_attention_fake)
def paged_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_seq_len: int,
    max_query_len: int,
) -> torch.Tensor:
    """:func:`~.attention.paged_attention` as an op: ``q [T, Hq, D]`` → ``[T, Hq, D]`` (dtype of ``q``)."""
    return paged_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        max_seq_len=max_seq_len,
        max_query_len=max_query_len,
    )


def _write_kv_cache_fake(k_cache, v_cache, k, v, slot_mapping):
    return None


@_register("write_kv_cache", _write_kv_cache_fake, mutates_args=("k_cache", "v_cache"))
def write_kv_cache_op(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """:func:`~.attention.write_kv_cache` as an op (writes ``k``/``v`` ``[T, Hkv, D]`` in place, slot ``-1``
    skipped)."""
    write_kv_cache(k_cache, v_cache, k, v, slot_mapping)


def _moe_experts_fake(x, gate_up_proj, down_proj, weights, ids, packed_key=-1):
    return torch.empty_like(x)


@_register("moe_experts", _moe_experts_fake)
def moe_experts_op(
    x: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    packed_key: int = -1,
) -> torch.Tensor:
    """:func:`omniduplex.kernels.moe.moe_experts` as an op: ``x [T, H]`` → ``[T, H]``; ``packed_key`` ≥ 0:
    the experts' oneDNN-packed weights are ``cpu_linear.PACKED[key : key + 2E]`` (gate_up then down)."""
    packed = None
    if packed_key >= 0:
        e = gate_up_proj.shape[0]
        packed = (
            cpu_linear.PACKED[packed_key : packed_key + e],
            cpu_linear.PACKED[packed_key + e : packed_key + 2 * e],
        )
    return moe_experts(x, gate_up_proj, down_proj, weights, ids, packed)


def _packed_linear_fake(x, key, bias, out_features):
    return x.new_empty((x.shape[0], out_features))


@_register("packed_linear", _packed_linear_fake)
def packed_linear_op(x: torch.Tensor, key: int, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """:func:`.cpu_linear.packed_linear` on the packed weight ``cpu_linear.PACKED[key]``: ``x`` bf16
    ``[T, in]`` → ``[T, out_features]``."""
    y = cpu_linear.packed_linear(x, cpu_linear.PACKED[key], bias)
    return y if y._base is None else y.clone()  # a padded GEMM returns a view of its rows
