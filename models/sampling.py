"""Sampling helpers of the models' own generation loops (outside the engine's batched sampler)."""

from __future__ import annotations

import torch


def repetition_penalty(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    """CTRL repetition penalty (Keskar et al. 2019, arXiv:1909.05858) on ``logits`` ``[V]``: the logit of each
    id in ``seen`` is divided by ``penalty`` when positive, multiplied when negative; a new tensor (``logits``
    itself when ``penalty`` is 1 or nothing was seen)."""
    if penalty == 1.0 or not seen:
        return logits
    idx = torch.tensor(sorted(set(seen)))
    s = logits[idx]
    logits = logits.clone()
    logits[idx] = torch.where(s < 0, s * penalty, s / penalty)
    return logits
