"""Mixture-of-experts dispatch on a CPU: each token's top-k SwiGLU experts (Qwen3-MoE), grouped by expert.

Grouping reads the expert ids on the host. Inside :func:`sync_free` (a step being captured as a CUDA
graph, or its CPU twin) :func:`moe_experts` reads nothing on the host: up to ``num_experts / top_k`` tokens it
gathers each (token, expert) pair's weights on the device and runs them as batched GEMMs (one expert's weights
read per pair, at most the layer's weights); past that every expert runs on every token as one batched GEMM
over the experts and each token's top-k outputs are picked and weighted on the device, so each expert's
weights are read exactly once, the floor once most experts are hit (a batch of 32 at top-8 of 128
hits ~110 of them). Captured decode steps of MoE models therefore cover every batch size.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from omniduplex.kernels import cpu_linear

_mode = threading.local()


@contextlib.contextmanager
def sync_free() -> Iterator[None]:
    """Within the block, :func:`moe_experts` dispatches without reading anything on the host."""
    before = getattr(_mode, "sync_free", False)
    _mode.sync_free = True
    try:
        yield
    finally:
        _mode.sync_free = before


def _gathered(x, gate_up_proj, down_proj, weights, ids) -> torch.Tensor:
    """The dispatch of :func:`moe_experts` with no host sync: each pair's expert weights gathered, batched."""
    t, k = ids.shape
    flat = ids.reshape(-1)
    xs = x[:, None, :].expand(t, k, x.shape[1]).reshape(t * k, 1, x.shape[1])  # [P, 1, H], no host sync
    gate, up = torch.bmm(xs, gate_up_proj.index_select(0, flat).transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(F.silu(gate) * up, down_proj.index_select(0, flat).transpose(1, 2))[:, 0]  # [P, H]
    return (y * weights.reshape(-1, 1)).view(t, k, -1).sum(dim=1)


def _dense(x, gate_up_proj, down_proj, weights, ids) -> torch.Tensor:
    """The dispatch of :func:`moe_experts` with no host sync past ``E / k`` tokens: all ``E`` experts on all
    ``T`` tokens (``[E, T, ·]`` batched GEMMs, each expert's weights read once), then each token's top-k
    outputs picked on the device and summed with its router weights (in pick order, as :func:`_gathered`)."""
    gate, up = torch.matmul(x.unsqueeze(0), gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)  # [E, T, I] each
    y = torch.matmul(F.silu(gate) * up, down_proj.transpose(1, 2))  # [E, T, H]
    rows = torch.arange(x.shape[0], device=x.device).unsqueeze(1).expand_as(ids)
    return (y[ids, rows] * weights.unsqueeze(-1)).sum(dim=1)  # [T, k, H] -> [T, H]


SMALL_DISPATCH = 4
"""Most (token, expert) pairs a step may have for :func:`moe_experts` to run them one by one (decode of one
or two sequences) instead of grouping them by expert."""


def moe_experts(
    x: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    packed: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Weighted sum of each token's top-k SwiGLU experts (Qwen3-MoE), dispatched for a CPU.

    Args:
        x: ``[T, H]`` tokens.
        gate_up_proj: ``[E, 2I, H]`` every expert's gate rows then up rows.
        down_proj: ``[E, H, I]``.
        weights: ``[T, k]`` router weights (dtype of ``x``); ``ids``: int64 ``[T, k]`` expert ids.
        packed: per-expert gate_up and down weights prepacked for oneDNN (:mod:`omniduplex.kernels
            .cpu_linear`), used instead of the plain ones when given.

    Returns ``[T, H]``. Every expert's GEMM runs only on the rows routed to it: few pairs (decode of one or
    two sequences, at most :data:`SMALL_DISPATCH`) run one by one on views of their expert's weights;
    more are sorted by expert into contiguous groups, one GEMM per expert hit, and summed back per token.
    The expert ids are read on the host (free on a CPU, where there is no device to wait for), except inside
    :func:`sync_free` (module docstring), where ``packed`` is not used.
    """
    if getattr(_mode, "sync_free", False):
        if ids.numel() <= gate_up_proj.shape[0]:
            return _gathered(x, gate_up_proj, down_proj, weights, ids)
        return _dense(x, gate_up_proj, down_proj, weights, ids)
    t, k = ids.shape
    flat = ids.reshape(-1)
    if packed is None:

        def gate_up_of(rows, e):
            return F.linear(rows, gate_up_proj[e])

        def down_of(rows, e):
            return F.linear(rows, down_proj[e])
    else:

        def gate_up_of(rows, e):
            return cpu_linear.packed_linear(rows, packed[0][e])

        def down_of(rows, e):
            return cpu_linear.packed_linear(rows, packed[1][e])

    if t * k <= SMALL_DISPATCH:
        w = weights.reshape(-1, 1)
        ys = []
        for j, e in enumerate(flat.tolist()):
            gate, up = gate_up_of(x[j // k : j // k + 1], e).chunk(2, dim=-1)
            ys.append(down_of(F.silu(gate) * up, e) * w[j])
        return torch.cat(ys).view(t, k, -1).sum(dim=1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up_proj.shape[0]).tolist()
    xs = x.index_select(0, order // k)
    outs, start = [], 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        gate, up = gate_up_of(xs[start : start + c], e).chunk(2, dim=-1)
        outs.append(down_of(F.silu(gate) * up, e))
        start += c
    ys = torch.cat(outs) * weights.reshape(-1)[order, None]
    # un-sort to [T, k, H] and sum over k (index_add_ is slow on CPU)
    unsorted = torch.empty_like(ys).index_copy_(0, order, ys)
    return unsorted.view(t, k, -1).sum(dim=1)
