"""Building blocks of the Qwen3-family and Llama decoders, for a flat token batch and a paged KV cache.

Parameter names match the published checkpoints (``q_norm``, ``o_proj``, ``mlp.gate``, ``mlp.experts``,
``mlp.shared_expert``, ...) except where projections of one input are merged into one GEMM, as vLLM does:
``self_attn.qkv_proj`` (``q_proj``, ``k_proj``, ``v_proj`` rows stacked), ``mlp.gate_up_proj`` (``gate_proj``,
``up_proj``), and the MoE experts (``gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``). The loader
(:func:`~.checkpoint.load_state_dict_into`) maps the published tensors onto them and
:func:`~.checkpoint.published_shapes_of` maps back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.kernels import (
    attention,
    cpu_ops,
    custom_ops,
    paged_attention,
    triton_ops,
    write_kv_cache,
)
from omniduplex.models.config import DecoderConfig
from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.moe_experts import Experts, Router


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in fp32: ``w * x / sqrt(mean(x²) + eps)``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.use_cpu_ops = False
        """One C++ op (``omniduplex_cpu::rms_norm``) instead of ~8 ATen calls (set by
        :func:`omniduplex.kernels.cpu_ops.attach`); the sum of squares is in another order (~1 ulp)."""
        self.use_triton_ops = False
        """The same as one Triton kernel on CUDA (set by :func:`omniduplex.kernels.triton_ops.attach`)."""

    def fused(self, x: torch.Tensor) -> bool:
        """Whether ``x`` goes through the C++ op (attached, eager, ``x`` in the weight's dtype)."""
        return self.use_cpu_ops and x.dtype == self.weight.dtype and not torch.compiler.is_compiling()

    def fused_triton(self, x: torch.Tensor) -> bool:
        """Whether ``x`` goes through the Triton kernels (attached, eager, ``x`` in the weight's dtype)."""
        return self.use_triton_ops and x.dtype == self.weight.dtype and not torch.compiler.is_compiling()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused(x):
            return torch.ops.omniduplex_cpu.rms_norm(x, self.weight, self.eps)
        if self.fused_triton(x):
            return triton_ops.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class MergedLinear(nn.Linear):
    """Several linear projections of the same input as one GEMM (vLLM's ``QKVParallelLinear`` /
    ``MergedColumnParallelLinear``): ``weight`` ``[sum(rows), in_features]`` stacks the parts' rows in order.

    Args:
        in_features: input width.
        parts: ``{published name: output rows}`` in stacking order, e.g. ``{"q_proj": 512, "k_proj": 256,
            "v_proj": 256}``; checkpoints keep these names (``<parent>.q_proj.weight``).
        bias: whether the parts have biases (all or none).
    """

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = tuple(parts.items())


def rope_inv_freq(head_dim: int, theta: float, device: str | torch.device | None = None) -> torch.Tensor:
    """RoPE's inverse frequencies ``theta^(-2i/D)``, fp32 ``[head_dim // 2]`` (Su et al. 2021)."""
    i = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float()
    return 1.0 / (theta ** (i / head_dim))


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021, "RoFormer"), rotate-half layout, ``inv_freq = theta^(-2i/D)``.

    Qwen3-Omni's Thinker and Talker use interleaved M-RoPE (sections [24, 20, 20]); for text and
    audio tokens the three position rows are equal (``get_rope_index`` gives audio sequential
    positions), where M-RoPE reduces exactly to this 1-D RoPE. Vision grids are not supported.
    """

    def __init__(self, head_dim: int, theta: float, table_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta), persistent=False)
        self.table_dtype = table_dtype
        """``cos``/``sin`` rounded to this dtype (and back to fp32) when set: Fish Speech's
        ``precompute_freqs_cis`` stores its table in bf16 (``fish_speech/models/text2semantic/llama.py``)."""

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` int64 ``[T]`` → ``(cos, sin)`` fp32 ``[T, head_dim]``."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.table_dtype is not None:
            return emb.cos().to(self.table_dtype).float(), emb.sin().to(self.table_dtype).float()
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, H, D]`` by ``cos``/``sin`` ``[T, D]`` (rotate-half convention)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return x * cos + rot * sin


class Attention(nn.Module):
    """GQA self-attention reading/writing a paged KV cache.

    Biases: ``cfg.qkv_bias`` on q/k/v (Qwen2), ``cfg.attention_bias`` on o_proj (and on q/k/v
    unless ``qkv_bias`` says otherwise). With ``cfg.qk_norm`` (Qwen3) q and k get a per-head RMSNorm
    (``q_norm``/``k_norm``, ``[head_dim]``) before RoPE; without it (Llama) those parameters do not
    exist, so strict loading sees no extras.
    """

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        bias = cfg.attention_bias
        qkv_bias = bias if cfg.qkv_bias is None else cfg.qkv_bias
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size}, qkv_bias
        )
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale = self.head_dim**-0.5
        self.use_cpu_ops = False
        """Write the KV cache (and attend, for one token) with the C++ ops (set by
        :func:`omniduplex.kernels.cpu_ops.attach`)."""
        self.use_triton_ops = False
        """q/k norm and RoPE as one in-place Triton kernel on CUDA (set by
        :func:`omniduplex.kernels.triton_ops.attach`)."""
        self.decode_fast_path = False
        """Decode-only batches (one query per sequence) take :func:`omniduplex.kernels.attention.gqa_decode`
        where it applies (set by :func:`omniduplex.kernels.attention.set_decode_fast_path`)."""

    def fused_triton(self, q: torch.Tensor, compiling: bool) -> bool:
        """Whether q/k norm + RoPE go through the Triton kernel (attached, eager, norms in ``q``'s dtype)."""
        norm_ok = self.q_norm is None or self.q_norm.weight.dtype == self.k_norm.weight.dtype == q.dtype
        return self.use_triton_ops and not compiling and norm_ok

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        batch: ForwardBatch,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """``x`` ``[T, hidden]`` → ``[T, hidden]``; writes this step's K/V into ``kv`` at ``slot_mapping``.
        ``rope`` ``None``: no rotation (``cfg.use_rope`` off)."""
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        compiling = torch.compiler.is_compiling()
        if rope is not None and self.fused_triton(q, compiling):
            # q/k norm + RoPE in place (q, k: views of this step's qkv), one kernel for both
            norms = () if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            triton_ops.rotary_(q, k, *rope, *norms)
        else:
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            # compiled: the registered ops, one opaque node each, no graph break (kernels/custom_ops.py); the
            # attention dispatcher picks the C++ decode kernel where it is loaded (kernels/attention.py)
            if rope is None:
                pass
            elif self.use_cpu_ops and not compiling:
                torch.ops.omniduplex_cpu.rotary_(q, k, *rope)  # in place (q, k: views of this step's qkv)
            else:
                q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        k_cache, v_cache = kv
        if self.use_cpu_ops:
            write = torch.ops.omniduplex_cpu.write_kv_cache
        else:
            write = custom_ops.write_kv_cache_op if compiling else write_kv_cache
        attend = custom_ops.paged_attention_op if compiling else paged_attention
        write(k_cache, v_cache, k, v, batch.slot_mapping)
        timer = attention.decode_timer() if batch.max_query_len == 1 and not compiling else None
        if timer is None:
            out = self._attend(q, kv, batch, attend)
        else:
            with timer:
                out = self._attend(q, kv, batch, attend)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))

    def _attend(self, q: torch.Tensor, kv, batch: ForwardBatch, attend) -> torch.Tensor:
        """``q`` ``[T, Hq, D]`` over the paged cache (this step's K/V written) → ``[T, Hq, D]``."""
        k_cache, v_cache = kv
        if self.decode_fast_path and batch.max_query_len == 1 and not torch.compiler.is_compiling():
            out = attention.gqa_decode(q, k_cache, v_cache, batch.block_tables, batch.seq_lens, self.scale)
            if out is not None:
                return out
        if self.use_cpu_ops and q.shape[0] == 1 and cpu_ops.fits_decode_kernel(q, k_cache):
            # one token is one sequence's decode: straight to the C++ kernel, no dispatcher (in a compiled
            # graph, where T is symbolic and >= 2, this branch is resolved while tracing)
            return torch.ops.omniduplex_cpu.paged_decode_attention(
                q, k_cache, v_cache, batch.block_tables, batch.seq_lens, self.scale
            )
        # the host lengths size the GPU decode kernel's split-KV; the compiled op takes tensors and ints only
        host = {"seq_lens_host": batch.seq_lens_host} if attend is paged_attention else {}
        return attend(
            q,
            k_cache,
            v_cache,
            batch.block_tables,
            batch.seq_lens,
            batch.query_start_loc,
            self.scale,
            max_seq_len=batch.max_seq_len,
            max_query_len=batch.max_query_len,
            **host,
        )


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` (Shazeer 2020), gate and up as one GEMM."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden, {"gate_proj": intermediate, "up_proj": intermediate}, False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.use_cpu_ops = False
        """SiLU·up as one C++ op, the same values (set by :func:`omniduplex.kernels.cpu_ops.attach`)."""
        self.use_triton_ops = False
        """SiLU·up as one Triton kernel on CUDA (set by :func:`omniduplex.kernels.triton_ops.attach`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_cpu_ops and not torch.compiler.is_compiling():
            return self.down_proj(torch.ops.omniduplex_cpu.silu_and_mul(self.gate_up_proj(x)))
        if self.use_triton_ops and not torch.compiler.is_compiling():
            return self.down_proj(triton_ops.silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """Sparse MoE block; with ``shared_expert_intermediate_size`` adds a sigmoid-gated shared expert
    (Qwen2-MoE / Qwen3-Omni Talker)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        else:
            self.shared_expert = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.gate(x))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: ``x + s·attn(norm(x))``, then ``x + s·mlp(norm(x))`` (``s`` =
    ``cfg.residual_scale``, 1 but for MiniCPM's depth-scaled residuals)."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = (
            SparseMoE(cfg) if cfg.is_moe_layer(layer_idx) else MLP(cfg.hidden_size, cfg.intermediate_size)
        )
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_scale = cfg.residual_scale
        self.quant_key = -1
        """Key of this layer in ``omniduplex_cpu::register_quant_layer`` (its GGUF blocks, norms and shapes),
        set by :func:`omniduplex.models.cascade.gguf_quantized.register_decode_layers`: a decode-only batch
        then runs the whole layer as one C++ call (``quant_decode_layer``)."""

    @staticmethod
    def _decode_in_one_call(x: torch.Tensor, batch: ForwardBatch, kv) -> bool:
        """A decode-only batch (one token per sequence), the cache in ``x``'s dtype, not being compiled."""
        return (
            batch.max_query_len == 1
            and x.shape[0] == batch.seq_lens.shape[0]
            and kv[0].dtype == x.dtype
            and not torch.compiler.is_compiling()
        )

    def forward(self, x, rope, batch: ForwardBatch, kv) -> torch.Tensor:
        if self.quant_key >= 0 and self._decode_in_one_call(x, batch, kv):
            return torch.ops.omniduplex_cpu.quant_decode_layer(
                x, self.quant_key, *rope, *kv, batch.slot_mapping, batch.block_tables, batch.seq_lens
            )
        norm, s = self.post_attention_layernorm, self.residual_scale
        a = self.self_attn(self.input_layernorm(x), rope, batch, kv)
        if s != 1.0:
            a = a * s
        if norm.fused(x):
            # the residual add and the second norm in one C++ pass
            x, h = torch.ops.omniduplex_cpu.add_rms_norm(x, a, norm.weight, norm.eps)
        elif norm.fused_triton(x):
            # the same on CUDA: one Triton kernel
            x, h = triton_ops.add_rms_norm(x, a, norm.weight, norm.eps)
        else:
            x = x + a
            h = norm(x)
        m = self.mlp(h)
        return x + (m * s if s != 1.0 else m)


class DecoderStack(nn.Module):
    """``layers`` + final ``norm`` over a flat token batch. Subclasses add the input embedding.

    ``forward(x [T, H], batch, kv_caches, capture_layer=None) -> (hidden [T, H], captured | None)``:
    ``captured`` is the ``transformers`` ``hidden_states[capture_layer]`` of the same tokens (0 = the
    inputs, i = output of layer i; the last index is the normed output, as ``transformers`` ties it).
    """

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta) if cfg.use_rope else None

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        capture_layer: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(self.layers)} layers")
        rope = self.rotary(batch.positions) if self.rotary is not None else None
        captured = x if capture_layer == 0 else None
        for i, layer in enumerate(self.layers, start=1):
            x = layer(x, rope, batch, kv_caches[i - 1])
            if capture_layer == i and i < len(self.layers):
                captured = x
        x = self.norm(x)
        if capture_layer == len(self.layers):
            captured = x
        return x, captured
