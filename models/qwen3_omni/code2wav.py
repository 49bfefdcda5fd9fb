"""Code2Wav: the Qwen3-Omni codec decoder, ``num_quantizers`` codebooks of codes at 12.5 Hz → 24 kHz waveform.

Architecture and tensor names follow the published ``code2wav.*`` weights of
Qwen/Qwen3-Omni-30B-A3B-Instruct (``Qwen3OmniMoeCode2Wav`` in ``transformers``):

1. ``code_embedding``: one table of ``num_quantizers × codebook_size`` rows; codebook ``q`` is offset by
   ``q · codebook_size``; the ``num_quantizers`` embeddings of a frame are averaged.
2. ``pre_transformer``: pre-norm transformer, causal sliding-window attention (``sliding_window`` frames
   including the current one), RoPE, SwiGLU MLP, per-channel layer scale (Touvron et al. 2021, CaiT).
3. ``upsample``: per ratio, a causal transposed conv (kernel = stride = ratio) and a ConvNeXt block
   (Liu et al. 2022) with a causal depthwise conv.
4. ``decoder``: causal conv, then per rate a DAC/BigVGAN-style block (SnakeBeta, causal transposed conv
   kernel ``2·rate``, residual units with dilations 1, 3, 9), SnakeBeta, causal conv to one channel,
   clamp to [-1, 1].

Every conv is causal except the decoder's transposed convs: their output sample ``t`` (on the block's
output grid) reads input ``t // rate`` and ``t // rate + 1``, and the samples that would need the input
past the end are trimmed. So ``frames`` frames give ``frames · total_upsample − lookahead_samples``
samples; the last ``lookahead_samples`` samples of a frame span appear once the next frame is known.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.qwen3_omni.code2wav_config import Code2WavConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019) over the last dim, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE (Su et al. 2021), rotate-half layout: int ``[T]`` → fp32 ``(cos, sin)`` ``[T, head_dim]``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    inv_freq = 1.0 / theta**exponents
    freqs = positions[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, T, heads, D]`` by ``cos``/``sin`` ``[T, D]``."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None].to(x.dtype) + rot * sin[:, None].to(x.dtype)


class CausalConv1d(nn.Module):
    """Stride-1 conv padded ``(kernel−1)·dilation`` zeros on the left: ``[B, C_in, T] → [B, C_out, T]``."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel, dilation=dilation, groups=groups)
        self.pad = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.pad, 0)))

    def earliest_input(self, t: int) -> int:
        """Earliest input index output ``t`` depends on."""
        return t - self.pad


class CausalTransConv1d(nn.Module):
    """Transposed conv trimmed by ``kernel − stride`` samples on both ends: ``[B, C_in, L] → [B, C_out, L']``.

    ``L' = (L − 1)·stride + kernel − 2·(kernel − stride)``: ``L·stride`` when ``kernel == stride``,
    ``(L − 1)·stride`` when ``kernel == 2·stride``.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_ch, out_ch, kernel, stride=stride)
        self.kernel, self.stride, self.trim = kernel, stride, kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., self.trim : y.shape[-1] - self.trim]

    def output_length(self, n: int) -> int:
        return (n - 1) * self.stride + self.kernel - 2 * self.trim

    @property
    def crops(self) -> tuple[int, int]:
        """Output samples dropped at the (start, end) of the full transposed-conv output."""
        return self.trim, self.trim

    def earliest_input(self, t: int) -> int:
        """Earliest input index output ``t`` depends on (``ceil((t + trim − kernel + 1) / stride)``)."""
        return -(-(t + self.trim - self.kernel + 1) // self.stride)


class SnakeBeta(nn.Module):
    """``x + sin²(x·e^α) / (e^β + 1e-9)`` per channel on ``[B, C, T]``; α, β stored as logs.

    Source: Ziyin et al. 2020 (Snake), BigVGAN (Lee et al. 2022) SnakeBeta with log-scale parameters.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + torch.sin(x * alpha).pow(2) / (beta + 1e-9)

    def earliest_input(self, t: int) -> int:
        return t


class ConvNeXtBlock(nn.Module):
    """ConvNeXt block (Liu et al. 2022) with a causal depthwise conv (kernel 7) on ``[B, C, T]``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.pwconv2(F.gelu(self.pwconv1(h))) * self.gamma
        return x + h.transpose(1, 2)

    def earliest_input(self, t: int) -> int:
        return self.dwconv.earliest_input(t)


class ResidualUnit(nn.Module):
    """``x + conv1x1(snake(conv7_dilated(snake(x))))`` on ``[B, C, T]``."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    def earliest_input(self, t: int) -> int:
        return self.conv1.earliest_input(self.conv2.earliest_input(t))


class DecoderBlock(nn.Module):
    """SnakeBeta, transposed conv ×``rate`` (``in_dim → out_dim``), residual units with dilations 1, 3, 9."""

    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(in_dim), CausalTransConv1d(in_dim, out_dim, 2 * rate, rate)]
            + [ResidualUnit(out_dim, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x

    def earliest_input(self, t: int) -> int:
        for layer in reversed(self.block):
            t = layer.earliest_input(t)
        return t


class Attention(nn.Module):
    """GQA self-attention with RoPE over ``[B, T, H]``; the mask is built by the caller."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """``x`` ``[B, T, H]``; ``cos``/``sin`` ``[T, head_dim]``; bool ``mask`` ``[T, T]``, True = attend."""
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, t, self.heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        groups = self.heads // self.kv_heads
        k, v = (z.transpose(1, 2).repeat_interleave(groups, dim=1) for z in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) · up(x))``."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LayerScale(nn.Module):
    """Per-channel residual scale (Touvron et al. 2021, "Going deeper with Image Transformers")."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    """Pre-norm block: ``x += ls1(attn(norm(x)))``, ``x += ls2(mlp(norm(x)))``."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    """Sliding-window causal transformer over frames: ``[B, F, H] → [B, F, H]``, positions 0..F−1.

    Frame ``i`` attends to frames ``j`` with ``i − sliding_window < j ≤ i``.
    """

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta
        self.window = cfg.sliding_window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        cos, sin = rope(pos, self.head_dim, self.theta)
        dist = pos[:, None] - pos[None, :]
        mask = (dist >= 0) & (dist < self.window)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)

    @property
    def reach_frames(self) -> int:
        """How many earlier frames one output frame can see: ``layers · (sliding_window − 1)``."""
        return len(self.layers) * (self.window - 1)


class Code2Wav(nn.Module):
    """Codes ``[B, num_quantizers, frames]`` → waveform ``[B, 1, frames·total_upsample − lookahead_samples]``.

    ``state_dict()`` keys are the published ``code2wav.*`` tensor names without the prefix.
    """

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.pre_transformer = PreTransformer(cfg)
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, cfg.hidden_size)
        offset = torch.arange(cfg.num_quantizers).view(1, -1, 1) * cfg.codebook_size
        self.register_buffer("code_offset", offset, persistent=False)
        h = cfg.hidden_size
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv1d(h, h, f, f), ConvNeXtBlock(h)]) for f in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim >> i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(h, cfg.decoder_dim, 7)]
            + [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)]
        )

    @property
    def total_upsample(self) -> int:
        """Samples per frame: ``prod(upsampling_ratios) · prod(upsample_rates)`` (1920 = 24 kHz / 12.5 Hz)."""
        return math.prod(self.cfg.upsampling_ratios) * math.prod(self.cfg.upsample_rates)

    def num_samples(self, frames: int) -> int:
        """Output length in samples for ``frames`` frames (``frames·total_upsample − lookahead_samples``)."""
        n = frames
        for m in self.modules():
            if isinstance(m, CausalTransConv1d):
                n = m.output_length(n)
        return n

    @property
    def lookahead_samples(self) -> int:
        """Samples at the end of a frame span that need the next frame: ``sum_i prod(upsample_rates[i:])``.

        555 for the published rates (8, 5, 4, 3). Output sample ``s`` of frames ``[0, n)`` equals sample
        ``s`` of any longer decode, so a decode of frames ``[0, n)`` stops ``lookahead_samples`` short of
        ``n·total_upsample``.
        """
        return self.total_upsample - self.num_samples(1)

    def _layers(self) -> list[nn.Module]:
        ups = [m for pair in self.upsample for m in pair]
        return ups + list(self.decoder)

    @property
    def receptive_field_frames(self) -> int:
        """Left context (frames) that makes a windowed decode (``chunked_decode``) exact at the window start.

        The earliest emitted sample of a window starting at frame ``s`` is sample ``s·total_upsample −
        lookahead_samples``. Walking the conv stack backwards (each conv/transposed conv maps an output
        index to the earliest input index it reads) gives the earliest pre-transformer frame that
        sample reads; the pre-transformer adds ``num_hidden_layers · (sliding_window − 1)`` frames. The
        sum is exact (not a bound): with one frame less, some emitted sample loses an input.
        For the published config this is 8·71 = 568 transformer frames plus the conv part.
        """
        t = -self.lookahead_samples  # window starting at frame 0 of an infinitely extended stream
        for layer in reversed(self._layers()):
            t = layer.earliest_input(t)
        return -t + self.pre_transformer.reach_frames

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Mean code embedding: int ``[B, num_quantizers, F]`` → ``[B, F, hidden_size]`` (weight dtype).

        Raises:
            ValueError: as :meth:`check_codes`.
        """
        self.check_codes(codes)
        return self.code_embedding(codes.long() + self.code_offset).mean(1)

    def check_codes(self, codes: torch.Tensor) -> None:
        """Raise ``ValueError`` for codes :meth:`embed` cannot take: wrong shape or dtype, no frames, or a
        code id outside ``[0, codebook_size)`` (the message names the codebook and the bound)."""
        q, size = self.cfg.num_quantizers, self.cfg.codebook_size
        if codes.dim() != 3 or codes.shape[1] != q:
            raise ValueError(f"code2wav: codes must be [B, {q}, frames], got {tuple(codes.shape)}")
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"code2wav: codes must be an integer tensor, got {codes.dtype}")
        if codes.shape[-1] < 1:
            raise ValueError("code2wav: codes hold no frames")
        bad = (codes < 0) | (codes >= size)
        if bool(bad.any()):
            b, book, f = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"code2wav: codebook {book} has id {int(codes[b, book, f])} at frame {f}, outside [0, {size})"
            )

    def synthesize(self, hidden: torch.Tensor) -> torch.Tensor:
        """Frame embeddings ``[B, F, hidden_size]`` → waveform ``[B, 1, num_samples(F)]`` in [-1, 1]."""
        x = self.pre_transformer(hidden).transpose(1, 2)
        for layer in self._layers():
            x = layer(x)
        return x.clamp(-1.0, 1.0)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes int ``[B, num_quantizers, F]`` → 24 kHz waveform ``[B, 1, F·total_upsample −
        lookahead_samples]``, dtype of the weights. Raises ``ValueError`` as :meth:`embed`."""
        return self.synthesize(self.embed(codes))
