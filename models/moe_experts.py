"""The routed half of a sparse MoE block (:class:`~.layers.SparseMoE`): the top-k router and the experts'
stacked weights, dispatched to our C++ op, the packed oneDNN path or
:func:`~omniduplex.kernels.moe.moe_experts`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.kernels import cpu_linear, custom_ops
from omniduplex.kernels.moe import moe_experts
from omniduplex.models.config import DecoderConfig


class Router(nn.Module):
    """Top-k softmax router (Qwen3-MoE): probabilities in fp32, optionally renormalised over the top k."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[T, H]`` → ``(weights [T, k] x.dtype, expert ids [T, k] int64)``."""
        probs = F.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return top_w.to(x.dtype), top_i


class Experts(nn.Module):
    """``E`` SwiGLU experts stored fused (``gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``); the
    dispatch is our C++ op (``omniduplex_cpu::moe_experts``, :mod:`omniduplex.kernels.cpu_ops`) once the model
    is prepared for CPU serving, else :func:`moe_experts` (an opaque custom op while compiled)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))
        self.packed: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self.packed_key = -1
        self.use_cpu_ops = False
        """Dispatch with the C++ op (set by :func:`omniduplex.kernels.cpu_ops.attach`)."""

    def prepack(self) -> int:
        """Pack every expert's weights for oneDNN where :func:`~omniduplex.kernels.cpu_linear.can_pack`
        allows (bf16 on a CPU with native bf16); returns the number of weights packed."""
        if not cpu_linear.can_pack(self.gate_up_proj[0]):
            return 0
        self.packed = (
            [cpu_linear.pack(w) for w in self.gate_up_proj],
            [cpu_linear.pack(w) for w in self.down_proj],
        )
        keys = [cpu_linear.register(p) for p in self.packed[0] + self.packed[1]]
        self.packed_key = keys[0]  # consecutive: gate_up of every expert, then down
        return 2 * self.gate_up_proj.shape[0]

    def packed_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(plain weight, packed weight)`` of one expert's two projections (the shapes every expert
        shares; for :func:`~omniduplex.kernels.cpu_linear.warm_up`), or ``[]`` when not packed."""
        if self.packed is None:
            return []
        return [(self.gate_up_proj[0], self.packed[0][0]), (self.down_proj[0], self.packed[1][0])]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``x`` ``[T, H]``, ``weights``/``ids`` ``[T, k]`` → ``[T, H]`` weighted sum of expert outputs."""
        if self.use_cpu_ops:
            return torch.ops.omniduplex_cpu.moe_experts(
                x, self.gate_up_proj, self.down_proj, weights, ids, self.packed_key
            )
        if torch.compiler.is_compiling():
            op = custom_ops.moe_experts_op
            return op(x, self.gate_up_proj, self.down_proj, weights, ids, self.packed_key)
        return moe_experts(x, self.gate_up_proj, self.down_proj, weights, ids, self.packed)
