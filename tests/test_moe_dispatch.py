"""The CPU MoE dispatch: per-pair for a few rows, grouped by expert for many; both equal the dense sum."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omniduplex.kernels.moe import SMALL_DISPATCH, moe_experts


def _dense(x, gate_up, down, weights, ids):
    """Every token through its k experts, one at a time: the definition."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += weights[t, j] * (down[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("tokens", [1, 2, 3, 17])
@pytest.mark.parametrize("k", [1, 2])
def test_dispatch_matches_the_dense_definition(tokens, k):
    g = torch.Generator().manual_seed(tokens * 10 + k)
    e, h, i = 6, 16, 8
    x = torch.randn(tokens, h, generator=g)
    gate_up, down = torch.randn(e, 2 * i, h, generator=g), torch.randn(e, h, i, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=g)
    got = moe_experts(x, gate_up, down, weights, ids)
    assert got.shape == (tokens, h)
    torch.testing.assert_close(got, _dense(x, gate_up, down, weights, ids), rtol=1e-4, atol=1e-4)
    # both paths are exercised by these sizes
    assert (tokens * k <= SMALL_DISPATCH) == (tokens * k in (1, 2, 3, 4))
