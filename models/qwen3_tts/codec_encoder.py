"""The 12 Hz codec encoder of Qwen3-TTS (``speech_tokenizer/``, ``Qwen3TTSTokenizerV2Model.encoder``): 24 kHz
audio → 16 codebooks of codes at 12.5 frames/s, for in-context voice cloning (reference codes).

Architecture (Mimi, Défossez et al. 2024, "Moshi"; ``transformers`` ``MimiModel`` encoder half, which the
reference subclasses; tensor names follow the published ``encoder.*`` weights):

1. ``encoder``: SEANet conv stack, every conv causal (left-padded ``kernel − stride`` with zeros, right-padded
   to a whole number of strides): conv(k7) → per ratio of ``reversed(upsampling_ratios)`` (4, 5, 6, 8):
   residual block (ELU, conv k3, ELU, conv k1; halving then restoring the width) and ELU + strided conv
   (kernel 2·ratio) doubling the width → ELU, conv(k3) to ``hidden_size``: 25 frames/s.
2. ``encoder_transformer``: pre-LayerNorm causal transformer, RoPE, GELU MLP, layer scale (no final norm).
3. ``downsample``: causal strided conv (kernel 4, stride 2, replicate padding, no bias): 12.5 frames/s.
4. ``quantizer``: split residual VQ: codebook 0 from ``semantic_residual_vector_quantizer``, the rest from
   ``acoustic_residual_vector_quantizer``, each projecting its input with a 1×1 conv and picking the nearest
   codebook vector (Euclidean) residual by residual. The reference keeps the first
   ``encoder_valid_num_quantizers`` (16) codebooks and ``ceil(samples / 1920)`` frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.config import ConfigError
from omniduplex.models.qwen3_omni.code2wav import rope


@dataclass
class CodecEncoderConfig:
    """``encoder_config`` (a ``MimiConfig``; defaults are ``transformers``' MimiConfig defaults)."""

    sampling_rate: int = 24000
    frame_rate: float = 12.5
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: list[int] = field(default_factory=lambda: [8, 6, 5, 4])
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 0
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    valid_quantizers: int = 16

    def __post_init__(self) -> None:
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        checks = [
            (self.use_causal_conv, "use_causal_conv=false"),
            (self.pad_mode == "constant", f"pad_mode={self.pad_mode!r}"),
            (not self.use_conv_shortcut, "use_conv_shortcut=true"),
            (self.hidden_act == "gelu", f"hidden_act={self.hidden_act!r}"),
            (self.audio_channels == 1, f"audio_channels={self.audio_channels}"),
            (self.num_attention_heads == self.num_key_value_heads, "grouped-query attention"),
            (self.num_semantic_quantizers == 1, f"num_semantic_quantizers={self.num_semantic_quantizers}"),
        ]
        bad = [what for ok, what in checks if not ok]
        if bad:
            raise ConfigError(f"codec encoder: {', '.join(bad)} not supported")
        if not 1 < self.valid_quantizers <= self.num_quantizers:
            raise ConfigError(
                f"codec encoder: {self.valid_quantizers} valid of {self.num_quantizers} quantizers"
            )

    @property
    def hop(self) -> int:
        """Input samples per output frame: ``prod(upsampling_ratios) · 2`` (1920)."""
        return math.prod(self.upsampling_ratios) * 2

    @classmethod
    def from_dict(cls, d: dict[str, Any], valid_quantizers: int = 16) -> CodecEncoderConfig:
        names = set(cls.__dataclass_fields__)
        return cls(
            **{k: v for k, v in d.items() if k in names and v is not None}, valid_quantizers=valid_quantizers
        )


class CausalConv(nn.Module):
    """Mimi's causal conv: ``[B, C_in, T] → [B, C_out, ceil(T / stride)]`` (left pad ``kernel − stride``)."""

    def __init__(
        self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
        mode: str = "constant",
    ) -> None:  # fmt: skip
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.kernel = (kernel - 1) * dilation + 1
        self.stride, self.mode = stride, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = self.kernel - self.stride
        n = x.shape[-1]
        frames = math.ceil((n - self.kernel + pad) / self.stride + 1) - 1
        extra = frames * self.stride + self.kernel - pad - n
        return self.conv(F.pad(x, (pad, extra), mode=self.mode))


class ResBlock(nn.Module):
    """``x + conv_k1(elu(conv_k3(elu(x))))`` with the middle at ``dim // compress`` channels."""

    def __init__(self, cfg: CodecEncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [nn.ELU(), CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation), nn.ELU(),
             CausalConv(hidden, dim, 1)]
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SEANetEncoder(nn.Module):
    """Waveform ``[B, 1, S]`` → ``[B, hidden_size, ceil(S / prod(ratios))]``."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(1, cfg.num_filters, cfg.kernel_size)]
        width = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            layers += [
                ResBlock(cfg, width, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)
            ]
            layers += [nn.ELU(), CausalConv(width, 2 * width, 2 * ratio, stride=ratio)]
            width *= 2
        layers += [nn.ELU(), CausalConv(width, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _Attention(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        h, n, d, b = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.attention_bias
        self.heads, self.head_dim = n, d
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(h, n * d, bias=b) for _ in range(3))
        self.o_proj = nn.Linear(n * d, h, bias=b)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        half = self.head_dim // 2
        q, k = ((z * cos + torch.cat((-z[..., half:], z[..., :half]), -1) * sin) for z in (q, k))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class _Mlp(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Scale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class _Layer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(cfg)
        self.mlp = _Mlp(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = _Scale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = _Scale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    """Causal transformer over ``[B, T, hidden]`` frames, positions 0..T−1 (full causal attention: the
    reference builds a plain causal mask here)."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = rope(torch.arange(x.shape[1], device=x.device), self.head_dim, self.theta)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def vectors(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = _Codebook(size, dim)


class EncoderRVQ(nn.Module):
    """``n`` codebooks after a 1×1 projection ``hidden → dim``; nearest vector, residual by residual."""

    def __init__(self, cfg: CodecEncoderConfig, n: int) -> None:
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        self.layers = nn.ModuleList(_VQ(cfg.codebook_size, cfg.codebook_dim) for _ in range(n))
        self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False)  # decoder side (unused here)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """``[B, hidden, T]`` → int64 ``[n, B, T]``."""
        residual = self.input_proj(x).transpose(1, 2)  # [B, T, dim]
        out = []
        for layer in self.layers[:n]:
            table = layer.codebook.vectors()
            flat = residual.reshape(-1, residual.shape[-1])
            idx = torch.cdist(flat[None].float(), table[None].float(), p=2)[0].argmin(-1)
            out.append(idx.view(residual.shape[:-1]))
            residual = residual - F.embedding(out[-1], table)
        return torch.stack(out)


class SplitEncoderRVQ(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.semantic_residual_vector_quantizer = EncoderRVQ(cfg, 1)
        self.acoustic_residual_vector_quantizer = EncoderRVQ(cfg, cfg.num_quantizers - 1)


class CodecEncoder(nn.Module):
    """24 kHz mono waveform → codes. ``state_dict()`` keys are the published ``encoder.*`` names without the
    prefix."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = EncoderTransformer(cfg)
        stride = round(cfg.sampling_rate / math.prod(cfg.upsampling_ratios) / cfg.frame_rate)
        self.downsample = CausalConv(
            cfg.hidden_size, cfg.hidden_size, 2 * stride, stride, bias=False, mode="replicate"
        )
        self.quantizer = SplitEncoderRVQ(cfg)

    @torch.no_grad()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """Mono waveform fp ``[S]`` in [-1, 1] at 24 kHz (any device) → int64 codes ``[ceil(S / 1920),
        valid_quantizers]`` on the weights' device.

        Raises ValueError for a non-1-D or empty waveform.
        """
        if wav.dim() != 1 or wav.shape[0] == 0:
            raise ValueError(
                f"codec encoder: expected a non-empty mono waveform [samples], got {tuple(wav.shape)}"
            )
        w = next(self.parameters())
        x = self.encoder(wav.to(w.device, w.dtype)[None, None])
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        x = self.downsample(x)
        q = self.quantizer
        codes = torch.cat(
            (
                q.semantic_residual_vector_quantizer.encode(x, 1),
                q.acoustic_residual_vector_quantizer.encode(x, self.cfg.valid_quantizers - 1),
            )
        )  # [Q, 1, T]
        frames = -(-wav.shape[0] // self.cfg.hop)
        return codes[:, 0, :frames].T
