"""Verification of speculative drafts: which of ``k`` proposed ids the target keeps, and the id it adds.

The target scores its pending row and the ``k`` drafts in one forward, giving ``k + 1`` logits rows: row ``i``
is the target's distribution ``p_i`` for the id after draft ``i - 1``. Rules:

* greedy (``temperature == 0``): drafts are kept while each equals the argmax of its row; the first row whose
  argmax differs (or row ``k`` when all are kept) adds its argmax. The output is exactly what decoding one id
  a step would give (lossless).
* sampling: speculative sampling (Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1; Chen et al.
  2023, arXiv 2302.01318): draft ``d_i`` drawn from ``q_i`` is kept with probability
  ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection the id is drawn from the residual
  ``norm(max(0, p_i - q_i))``; when all are kept the extra id is drawn from ``p_k``. Every emitted id is
  distributed as ``p`` (the target's own distribution after temperature, top-k and top-p). A prompt-lookup
  draft is deterministic: ``q_i`` is the point mass on ``d_i``, so it is kept with probability ``p_i(d_i)``
  and the residual is ``p_i`` without ``d_i``.

Randomness is counter-based (:func:`~.sampler.counter_uniform`): the uniforms of a request's ``n``-th output
position depend on its seed and ``n`` only, at indices above any vocabulary id (independent of the sampler's
Gumbel noise at the same position).
"""

from __future__ import annotations

import torch

from omniduplex.pipeline.engine.request import SamplingParams
from omniduplex.pipeline.engine.sampler import _top_k_top_p, counter_uniform

ACCEPT_INDEX, RESIDUAL_INDEX = 1 << 40, (1 << 40) + 1
"""Noise indices of the acceptance test and of the residual / bonus draw (above every vocabulary id)."""


def target_probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """float64 ``[n, V]`` probabilities of fp32 ``logits`` ``[n, V]`` under ``sp``'s temperature (> 0), top-k
    and top-p: the distribution the engine's sampler draws from (:func:`~.sampler.sample`)."""
    n = logits.shape[0]
    top_k = torch.full((n,), sp.top_k, dtype=torch.int64, device=logits.device)
    top_p = torch.full((n,), sp.top_p, dtype=torch.float32, device=logits.device)
    scaled = _top_k_top_p(logits.float() / sp.temperature, top_k, top_p)
    return scaled.double().softmax(dim=-1)


def _draw(probs: torch.Tensor, u: float) -> int:
    """The id whose CDF interval of (unnormalised) ``probs`` ``[V]`` holds ``u * sum``."""
    cdf = probs.cumsum(0)
    at = torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype), right=True)
    return int(at.clamp(max=probs.shape[0] - 1))


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> list[int]:
    """Greedy rule: ``logits`` ``[k + 1, V]`` (suppressed ids already ``-inf``), ``drafts`` ``k`` ids →
    the emitted ids: the kept drafts, then the target's argmax after them (1 to ``k + 1`` ids)."""
    best = logits.max(dim=-1).indices.tolist()
    a = 0
    while a < len(drafts) and best[a] == drafts[a]:
        a += 1
    return drafts[:a] + [best[a]]


def verify_sampled(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    sp: SamplingParams,
    position: int,
) -> list[int]:
    """Speculative-sampling rule (module docstring).

    Args:
        logits: fp32 ``[k + 1, V]`` target logits (suppressed ids already ``-inf``).
        drafts: the ``k`` proposed ids.
        q: float64 ``[k, V]``, the draft distributions the ids were drawn from; ``None``: deterministic drafts
            (point masses).
        sp: the request's sampling parameters (``temperature > 0``; ``seed`` set).
        position: the request's output position of the first emitted id (``len(output_ids)``).

    Returns: the emitted ids (1 to ``k + 1``).
    """
    k = len(drafts)
    p = target_probs(logits, sp)
    seeds = torch.full((k + 1,), int(sp.seed), dtype=torch.int64)
    counters = position + torch.arange(k + 1, dtype=torch.int64)
    idx = torch.tensor([[ACCEPT_INDEX, RESIDUAL_INDEX]], dtype=torch.int64).expand(k + 1, 2)
    u = counter_uniform(seeds, counters, 2, idx).tolist()
    p_cpu = p.cpu()
    for i, d in enumerate(drafts):
        qd = 1.0 if q is None else float(q[i, d])
        if u[i][0] * qd < float(p_cpu[i, d]):  # u < p/q without dividing by a zero q
            continue
        if q is None:
            residual = p_cpu[i].clone()
            residual[d] = 0.0
        else:
            residual = (p_cpu[i] - q[i].to(p_cpu)).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p is right
            residual = p_cpu[i]
        return drafts[:i] + [_draw(residual, u[i][1])]
    return drafts + [_draw(p_cpu[k], u[k][1])]
