"""MiniCPM4 stacks over the shared decoder layers: the paged LMs and the dense bidirectional local models.

A MiniCPM4 layer is a Llama layer (RMSNorm, GQA without q/k norm or biases, SwiGLU) whose residual branches
are scaled by ``scale_depth / sqrt(num_layers)`` when ``use_mup`` (:attr:`DecoderConfig.residual_scale`),
under LongRoPE (:class:`LongRotaryEmbedding`) or, for VoxCPM2's residual LM, no rotary at all
(:attr:`DecoderConfig.use_rope`). Parameter names are the published ones (``layers.N.self_attn.q_proj``,
``mlp.gate_proj``, ``input_layernorm``, ``norm``; q/k/v and gate/up merged into one GEMM each as the shared
layers do, split back by the loader).

* :class:`MiniCPMStack` runs on the engine's flat token batch and paged KV cache (base and residual LM).
* :func:`dense_forward` runs the same modules over ``[N, S, H]`` with full (non-causal) attention and no
  cache: the local encoder (a patch plus its CLS token) and the local DiT (11 tokens), as
  ``MiniCPMModel.forward(is_causal=False)`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.layers import Attention, DecoderStack, apply_rotary
from omniduplex.models.voxcpm2.config import LongRope, Stack


class LongRotaryEmbedding(nn.Module):
    """LongRoPE cos/sin (:class:`~.config.LongRope`): ``freq[p, i] = (p · (1 / factor[i])) · inv_freq[i]``,
    ``inv_freq[i] = theta^(−2i/D)``, rotate-half layout, both multiplied by the scaling factor. The products
    are taken in the order ``MiniCPMLongRoPE`` builds its table, so a position's row is bit-equal to it.

    ``forward(positions int64 [T]) -> (cos, sin)`` fp32 ``[T, head_dim]`` (fp32 whatever the model dtype:
    the frequencies are kept off the module's parameters and buffers).
    """

    def __init__(self, head_dim: int, theta: float, rope: LongRope) -> None:
        super().__init__()
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.inv_factor = 1.0 / torch.tensor(rope.factors, dtype=torch.float32)
        self.scaling = rope.scaling

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev = positions.device
        t = positions.to(torch.float32)
        freqs = (t[:, None] * self.inv_factor.to(dev)[None, :]) * self.inv_freq.to(dev)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.scaling == 1.0:
            return emb.cos(), emb.sin()
        return emb.cos() * self.scaling, emb.sin() * self.scaling


class MiniCPMStack(DecoderStack):
    """A MiniCPM4 stack: the shared :class:`DecoderStack` with LongRoPE (or none) and, with ``embed``, the
    token table ``embed_tokens`` ``[vocab, H]`` (the base LM; the other stacks take embeddings)."""

    def __init__(self, stack: Stack, embed: bool = False) -> None:
        super().__init__(stack.decoder)
        cfg = stack.decoder
        if stack.rope is not None:
            self.rotary = LongRotaryEmbedding(cfg.head_dim, cfg.rope_theta, stack.rope)
        if embed:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


def _attend(a: Attention, h: torch.Tensor, n: int, s: int, rope) -> torch.Tensor:
    """Full self-attention of ``n`` sequences of ``s`` rows each: ``h`` ``[n·s, H]`` → ``[n·s, H]``."""
    q, k, v = a.qkv_proj(h).split((a.q_size, a.kv_size, a.kv_size), dim=-1)
    q = q.reshape(n, s, a.num_heads, a.head_dim)
    k = k.reshape(n, s, a.num_kv_heads, a.head_dim)
    v = v.reshape(n, s, a.num_kv_heads, a.head_dim)
    if rope is not None:
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=a.num_heads != a.num_kv_heads
    )
    return a.o_proj(out.transpose(1, 2).reshape(n * s, a.num_heads * a.head_dim))


def dense_forward(stack: DecoderStack, x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[N, S, H]`` → normed output ``[N, S, H]``: every row attends to all ``S`` rows of its sequence
    (positions ``0 .. S−1``); no KV cache."""
    n, s, h = x.shape
    rope = stack.rotary(torch.arange(s, device=x.device)) if stack.rotary is not None else None
    x = x.reshape(n * s, h)
    for layer in stack.layers:
        scale = layer.residual_scale
        a = _attend(layer.self_attn, layer.input_layernorm(x), n, s, rope)
        x = x + (a * scale if scale != 1.0 else a)
        m = layer.mlp(layer.post_attention_layernorm(x))
        x = x + (m * scale if scale != 1.0 else m)
    return stack.norm(x).reshape(n, s, h)
