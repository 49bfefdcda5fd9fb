"""Mixture-of-experts dispatch on a CPU: each token's top-k SwiGLU experts (Qwen3-MoE), grouped by expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omniduplex.kernels import cpu_linear

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
    The expert ids are read on the host (free on a CPU, where there is no device to wait for).
    """
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
