"""The streaming transformer shared by Mimi, Moshi's temporal transformer and its depth transformer
(Moshi paper arXiv 2410.00037 §3.4; tensor names of ``moshi/modules/transformer.py``).

Pre-norm layers: ``x + ls1(attn(norm1(x)))`` then ``x + ls2(ffn(norm2(x)))``; LayerNorm (Mimi) or RMSNorm in
fp32 (Moshi, ``alpha`` ``[1, 1, D]``, eps 1e-8); FFN either GELU (``linear1``/``linear2``, Mimi) or a SiLU
gated unit (``gating.linear_in`` ``[2H, D]``, ``gating.linear_out``); RoPE in the interleaved (complex pair)
layout, ``θ_i = max_period^(-2i/D)`` (Su et al. 2021). Attention is causal over at most ``context`` past
steps,
reading a per-row ring KV cache of ``context`` slots when streaming. The depth transformer uses one set of
weights per codebook step (``weights_per_step``: ``in_proj_weight`` stacks them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.moshi.streaming import Streaming


class RMSNormF32(nn.Module):
    """``y = x · alpha / sqrt(eps + mean(x²))`` in fp32 (``rms_norm_f32``), ``x`` ``[B, T, D]``."""

    def __init__(self, dim: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.alpha.dtype == torch.float32:  # no casts to dispatch
            return x * (self.alpha * torch.rsqrt(self.eps + torch.mean(x * x, dim=2, keepdim=True)))
        xf = x.float()
        var = self.eps + torch.mean(xf**2, dim=2, keepdim=True)
        return (xf * (self.alpha.float() * torch.rsqrt(var))).to(x.dtype)


def make_norm(kind: str, dim: int) -> nn.Module:
    """``layer_norm`` (eps 1e-5) or ``rms_norm_f32`` (eps 1e-8). Raises ValueError otherwise."""
    if kind == "layer_norm":
        return nn.LayerNorm(dim, eps=1e-5)
    if kind == "rms_norm_f32":
        return RMSNormF32(dim)
    raise ValueError(f"unsupported norm {kind!r}")


def rope_angles(offset: torch.Tensor, t: int, d: int, max_period: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` float32 ``[B, 1, T, d/2]`` of RoPE at positions ``offset[b] + t`` (int64 ``[B]``),
    ``θ_i = max_period^(-2i/d)`` (Su et al. 2021)."""
    ds = torch.arange(d // 2, device=offset.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / d))
    ts = offset.float().view(-1, 1, 1, 1) + torch.arange(t, device=offset.device, dtype=torch.float32).view(
        1, 1, -1, 1
    )
    return torch.cos(freqs * ts), torch.sin(freqs * ts)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` (interleaved pairs) by :func:`rope_angles`' ``cos``/``sin``."""
    d = x.shape[-1]
    xv = x.view(*x.shape[:-1], d // 2, 2)
    re, im = xv[..., 0].float(), xv[..., 1].float()
    return torch.stack([(re * cos - im * sin).to(x.dtype), (re * sin + im * cos).to(x.dtype)], -1).view(
        x.shape
    )


def rope(q: torch.Tensor, k: torch.Tensor, offset: torch.Tensor, max_period: float):
    """Rotate ``q``, ``k`` ``[B, H, T, D]`` (interleaved pairs) at positions ``offset[b] + t`` (int64
    ``[B]``)."""
    cos, sin = rope_angles(offset, q.shape[2], q.shape[-1], max_period)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


class _Proj(nn.Module):
    """A bias-free projection holding ``weight`` ``[steps·out, in]`` (one block per step)."""

    def __init__(self, d_in: int, d_out: int, steps: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(steps * d_out, d_in))
        nn.init.normal_(self.weight, std=d_in**-0.5)
        self.d_out = d_out

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        return F.linear(x, self.weight[step * self.d_out : (step + 1) * self.d_out])


class AttentionPlan:
    """What every layer of one transformer call shares (the layers of a stack step together): ``offset``
    int64 ``[B]`` (steps seen before the call), RoPE ``cos``/``sin`` (or ``None``), the visibility ``mask``
    bool ``[B, T, S]`` over the ``filled`` cache slots read (or the call's own ``T`` keys when not
    streaming)."""

    def __init__(self, offset, cos, sin, mask, filled: int) -> None:
        self.offset, self.cos, self.sin, self.mask, self.filled = offset, cos, sin, mask, filled


class Attention(Streaming):
    """Causal multi-head self-attention with a ring KV cache. ``x`` ``[B, T, D]`` → ``[B, T, D]``.

    Streaming rows keep ``k``/``v`` ``[H, capacity, D/H]`` and ``offset`` (int64, steps seen). A key at
    position ``p`` is visible from query ``q`` when ``0 <= q - p < context`` (all past when context is
    None). A one-step call (``T == 1``, decode) computes the attention as two matmuls with an fp32 softmax
    (memory-bound over the cache; faster than the fused CPU kernel, notably in bf16)."""

    def __init__(
        self, dim: int, heads: int, context: int | None, max_period: float | None, steps: int = 1
    ) -> None:
        super().__init__()
        self.dim, self.heads, self.context, self.max_period = dim, heads, context, max_period
        self.capacity = context if context is not None else steps
        self.fixed_window = False
        """Always attend over the whole ring (CUDA graphs bake host ints in; set by the duplex engine)."""
        self.filled = 0
        self.frame_kv: torch.Tensor | None = None
        """``[2, B, H, steps, D/H]`` while the depth transformer runs a frame (:meth:`_frame_step`)."""
        self.in_proj = _Proj(dim, 3 * dim, steps)
        self.out_proj = _Proj(dim, dim, steps)

    def new_state(self, rows: int) -> dict[str, torch.Tensor]:
        w = self.in_proj.weight
        self.filled = 0
        kv = (rows, self.heads, self.capacity, self.dim // self.heads)
        return {
            "k": torch.zeros(kv, dtype=w.dtype, device=w.device),
            "v": torch.zeros(kv, dtype=w.dtype, device=w.device),
            "offset": torch.zeros(rows, dtype=torch.long, device=w.device),
        }

    def plan(self, b: int, t: int, device: torch.device) -> AttentionPlan:
        """The shared part of a call over ``b`` rows and ``t`` steps (see :class:`AttentionPlan`)."""
        streaming = self.state is not None
        offset = (
            self.rows(b)["offset"].clone() if streaming else torch.zeros(b, dtype=torch.long, device=device)
        )
        cos = sin = None
        if self.max_period is not None:
            cos, sin = rope_angles(offset, t, self.dim // self.heads, self.max_period)
        steps = torch.arange(t, device=device)
        if streaming:
            cap = self.capacity
            # slots past the most any row has written are masked for every row: leave them out (host count)
            filled = cap if self.fixed_window else min(cap, self.filled + t)
            slots = torch.arange(filled, device=device)
            last = offset.view(-1, 1) + t - 1
            delta = slots - last % cap
            pos_k = torch.where(delta <= 0, last + delta, last + delta - cap)
            pos_k = torch.where(slots >= offset.view(-1, 1) + t, torch.full_like(pos_k, -1), pos_k)
        else:
            filled = t
            pos_k = steps.expand(b, -1)
        pos_q = offset.view(-1, 1, 1) + steps.view(-1, 1)
        delta = pos_q - pos_k[:, None]
        mask = (pos_k[:, None] >= 0) & (delta >= 0)
        if self.context is not None:
            mask = mask & (delta < self.context)
        return AttentionPlan(offset, cos, sin, mask, filled)

    def forward(self, x: torch.Tensor, step: int = 0, plan: AttentionPlan | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.in_proj(x, step).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.frame_kv is not None:
            return self._frame_step(q, k, v, step)
        if plan is None:
            plan = self.plan(b, t, x.device)
        if plan.cos is not None:
            q, k = apply_rope(q, plan.cos, plan.sin), apply_rope(k, plan.cos, plan.sin)
        if self.state is not None:
            st = self.rows(b)
            slot = (plan.offset.view(-1, 1) + torch.arange(t, device=x.device)) % self.capacity
            row = torch.arange(b, device=x.device).view(-1, 1).expand(-1, t)
            # index_put_ on the [B, slot, H, D] view writes only the new slots (scatter_ copies the whole
            # bf16 cache on CPU)
            st["k"].transpose(1, 2).index_put_((row, slot), k.transpose(1, 2))
            st["v"].transpose(1, 2).index_put_((row, slot), v.transpose(1, 2))
            self.filled = plan.filled
            k, v = st["k"][:, :, : plan.filled], st["v"][:, :, : plan.filled]
            st["offset"].add_(t)
        if t == 1:
            scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
            scores = scores.masked_fill(~plan.mask[:, None], float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, plan.mask[:, None], dropout_p=0.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.dim), step)

    def _frame_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        """Step ``step`` of a frame-local sequence (the depth transformer's codebooks): every row is at
        position ``step``, so the new key/value go to slot ``step`` of :attr:`frame_kv` and the query sees
        slots ``0..step``, all visible (no mask, no index tensors, no RoPE)."""
        b = q.shape[0]
        kv = self.frame_kv
        kv[0, :, :, step] = k[:, :, 0]
        kv[1, :, :, step] = v[:, :, 0]
        keys, values = kv[0, :, :, : step + 1], kv[1, :, :, : step + 1]
        scores = torch.matmul(q, keys.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        if scores.dtype != torch.float32:
            scores = scores.float()
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs if probs.dtype == values.dtype else probs.to(values.dtype), values)
        return self.out_proj(out.transpose(1, 2).reshape(b, 1, self.dim), step)


class Gating(nn.Module):
    """SiLU-gated FFN (``linear_in`` ``[2H, D]``: gate rows then value rows; ``linear_out`` ``[D, H]``); the
    hidden width ``H`` is ``21·D/8`` when ``ff == 4·D`` else ``2·ff/3`` (``moshi/modules/gating.py``)."""

    def __init__(self, dim: int, ff: int) -> None:
        super().__init__()
        hidden = (21 * dim) // 8 if ff == 4 * dim else (2 * ff) // 3
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_in(x)
        b, t, _ = h.shape
        h = h.view(b, t, 2, -1)
        return self.linear_out(F.silu(h[..., 0, :]) * h[..., 1, :])


class LayerScale(nn.Module):
    """Per-channel residual scale (Touvron et al. 2021), ``scale`` ``[D]``."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Layer(nn.Module):
    """One pre-norm transformer layer (see the module docstring)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        ff: int,
        norm: str,
        gating: str,
        context: int | None,
        max_period: float | None,
        layer_scale: float | None,
        steps: int = 1,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads, context, max_period, steps)
        self.norm1, self.norm2 = make_norm(norm, dim), make_norm(norm, dim)
        self.steps = steps
        if gating == "none":
            self.linear1 = nn.Linear(dim, ff, bias=False)
            self.linear2 = nn.Linear(ff, dim, bias=False)
        elif steps > 1:
            self.gating = nn.ModuleList([Gating(dim, ff) for _ in range(steps)])
        else:
            self.gating = Gating(dim, ff)
        if layer_scale is None:
            self.layer_scale_1, self.layer_scale_2 = nn.Identity(), nn.Identity()
        else:
            self.layer_scale_1, self.layer_scale_2 = (
                LayerScale(dim, layer_scale),
                LayerScale(dim, layer_scale),
            )

    def forward(self, x: torch.Tensor, step: int = 0, plan: AttentionPlan | None = None) -> torch.Tensor:
        x = x + self.layer_scale_1(self.self_attn(self.norm1(x), step, plan))
        h = self.norm2(x)
        if hasattr(self, "linear1"):
            update = self.linear2(F.gelu(self.linear1(h)))
        elif self.steps > 1:
            update = self.gating[step](h)
        else:
            update = self.gating(h)
        return x + self.layer_scale_2(update)


class Transformer(nn.Module):
    """A stack of :class:`Layer` (``layers.{i}``). ``x`` ``[B, T, D]`` → ``[B, T, D]``; ``step`` picks the
    depth transformer's per-codebook weights."""

    def __init__(
        self,
        dim: int,
        heads: int,
        layers: int,
        ff: int,
        norm: str,
        gating: str,
        context: int | None,
        positional_embedding: str,
        max_period: float,
        layer_scale: float | None,
        steps: int = 1,
    ) -> None:
        super().__init__()
        period = max_period if positional_embedding == "rope" else None
        if positional_embedding not in ("rope", "none"):
            raise ValueError(f"unsupported positional embedding {positional_embedding!r}")
        self.layers = nn.ModuleList(
            [Layer(dim, heads, ff, norm, gating, context, period, layer_scale, steps) for _ in range(layers)]
        )

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        first = self.layers[0].self_attn
        # one mask and RoPE per call (none for a frame-local step)
        plan = None if first.frame_kv is not None else first.plan(x.shape[0], x.shape[1], x.device)
        for layer in self.layers:
            x = layer(x, step, plan)
        return x


class ProjectedTransformer(nn.Module):
    """Mimi's transformer on the conv layout: ``x`` ``[B, C, T]`` → ``[B, C, T]`` (``transformer.*``, and
    ``input_proj`` / ``output_projs.0`` only when ``d_model`` differs from the input width)."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        d, d_in = cfg["d_model"], cfg["input_dimension"]
        self.transformer = Transformer(
            d,
            cfg["num_heads"],
            cfg["num_layers"],
            cfg["dim_feedforward"],
            cfg["norm"],
            cfg["gating"],
            cfg["context"],
            cfg["positional_embedding"],
            cfg["max_period"],
            cfg["layer_scale"],
        )
        if d != d_in:
            self.input_proj = nn.Linear(d_in, d, bias=False)
        d_out = cfg["output_dimensions"][0]
        self.output_projs = nn.ModuleList([nn.Identity() if d == d_out else nn.Linear(d, d_out, bias=False)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        if hasattr(self, "input_proj"):
            x = self.input_proj(x)
        return self.output_projs[0](self.transformer(x)).transpose(1, 2)
