"""VoxCPM2's two local transformers: the patch encoder (LocEnc) and the flow-matching estimator (LocDiT).

Both are small bidirectional MiniCPM4 stacks run over a handful of rows per patch
(:func:`~.minicpm.dense_forward`). Source: VoxCPM (OpenBMB, arXiv 2509.24650) and ``voxcpm`` 2.0.3
(``modules/locenc/local_encoder.py``, ``modules/locdit/local_dit_v2.py``); tensor names are those of
``feat_encoder.*`` and ``feat_decoder.estimator.*`` in ``model.safetensors``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from omniduplex.models.voxcpm2.config import Stack
from omniduplex.models.voxcpm2.minicpm import MiniCPMStack, dense_forward


class LocEnc(nn.Module):
    """Patch encoder: latents ``[B, T, P, D]`` → one vector per patch ``[B, T, He]``.

    Each patch's ``P`` latent frames (``in_proj`` to the encoder width) follow a learned ``special_token``
    ``[1, 1, 1, He]``; the encoder's output at that first (CLS) row is the patch's embedding.
    """

    def __init__(self, stack: Stack, feat_dim: int) -> None:
        super().__init__()
        h = stack.decoder.hidden_size
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, h))
        self.in_proj = nn.Linear(feat_dim, h)
        self.encoder = MiniCPMStack(stack)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, p, _ = x.shape
        x = self.in_proj(x)
        x = torch.cat((self.special_token.expand(b, t, 1, -1), x), dim=2).reshape(b * t, p + 1, -1)
        return dense_forward(self.encoder, x)[:, 0].reshape(b, t, -1)


def sinusoidal_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """Timestep embedding ``[N]`` → ``[N, dim]``: ``[sin(s·t·f), cos(s·t·f)]``, ``f_i = 10000^(−i/(dim/2−1))``
    (``SinusoidalPosEmb`` of Grad-TTS / Matcha-TTS; ``s`` = 1000)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -(math.log(10000) / (half - 1)))
    emb = scale * t[:, None] * freq[None, :]
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepMLP(nn.Module):
    """``linear_2(silu(linear_1(x)))`` (``TimestepEmbedding``), width-preserving."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(torch.nn.functional.silu(self.linear_1(x)))


class LocDiT(nn.Module):
    """The flow-matching velocity estimator ("LocDiT", v2 conditioning).

    Rows of one sequence: the LM conditioning ``mu`` as ``2`` tokens (the base-LM and residual-LM
    projections, each ``Hd`` wide), the time token, the previous patch (``cond``, ``P'`` rows) and the noisy
    patch (``P`` rows); the outputs at the noisy patch's rows, ``out_proj`` back to ``D``, are the velocity.
    """

    def __init__(self, stack: Stack, feat_dim: int) -> None:
        super().__init__()
        h = stack.decoder.hidden_size
        self.hidden = h
        self.in_proj = nn.Linear(feat_dim, h)
        self.cond_proj = nn.Linear(feat_dim, h)
        self.out_proj = nn.Linear(h, feat_dim)
        self.time_mlp = TimestepMLP(h)
        self.delta_time_mlp = TimestepMLP(h)
        self.decoder = MiniCPMStack(stack)

    def forward(
        self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, dt: torch.Tensor
    ) -> torch.Tensor:
        """``x`` ``[N, D, P]`` noisy patch, ``mu`` ``[N, 2·Hd]``, ``t`` / ``dt`` ``[N]``, ``cond``
        ``[N, D, P']`` → velocity ``[N, D, P]``."""
        x = self.in_proj(x.transpose(1, 2))
        cond = self.cond_proj(cond.transpose(1, 2))
        temb = self.time_mlp(sinusoidal_embedding(t, self.hidden).to(x.dtype))
        temb = temb + self.delta_time_mlp(sinusoidal_embedding(dt, self.hidden).to(x.dtype))
        mu = mu.reshape(x.shape[0], -1, x.shape[-1])
        seq = torch.cat((mu, temb[:, None], cond, x), dim=1)
        out = dense_forward(self.decoder, seq)[:, mu.shape[1] + 1 + cond.shape[1] :]
        return self.out_proj(out).transpose(1, 2)
