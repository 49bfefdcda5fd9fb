"""Qwen3-Omni audio encoder (the Thinker's ``audio_tower``): log-mels → audio token embeddings.

Architecture (Qwen3-Omni technical report, arXiv:2509.17765, "AuT" encoder; tensor names as
published under ``thinker.audio_tower.`` in Qwen/Qwen3-Omni-30B-A3B-Instruct):

1. the mel sequence of each utterance is cut into chunks of ``2 · n_window`` frames (1 s at the
   default 50, 10 ms frames); each chunk goes through three stride-2 3×3 ``Conv2d`` + GELU
   (8× downsampling in time and frequency), then ``conv_out`` (no bias) maps channels × freq to
   ``d_model``; sinusoidal positions restart at 0 in every chunk (Whisper ``sinusoids``);
2. pre-LN Transformer layers attend within windows of ``n_window_infer // (2 · n_window)``
   chunks' worth of tokens (bidirectional inside a window, nothing across windows);
3. ``ln_post`` → ``proj1`` → activation → ``proj2`` to the Thinker's hidden size.

Batch semantics: every utterance's rows equal the reference ``Qwen3OmniMoeAudioEncoder`` run on
that utterance alone. The reference pads all chunks of a call to the longest chunk in the call, and
its convolutions read that padding, so a lone utterance shorter than one chunk changes when batched
with longer ones; here a chunk is always padded as it would be in its own utterance's call.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.config import ConfigError, resolve_aliases

AUDIO_ALIASES: dict[str, str] = {
    "num_hidden_layers": "encoder_layers",
    "hidden_size": "d_model",
    "num_attention_heads": "encoder_attention_heads",
    "intermediate_size": "encoder_ffn_dim",
}
"""``audio_config`` key → :class:`AudioEncoderConfig` field (``transformers``'
``Qwen3OmniMoeAudioEncoderConfig.attribute_map``)."""

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@dataclass
class AudioEncoderConfig:
    """``thinker_config.audio_config`` of a Qwen3-Omni ``config.json``; defaults as ``transformers``'
    ``Qwen3OmniMoeAudioEncoderConfig`` (the 30B-A3B checkpoint's values).

    ``dropout``/``attention_dropout``/``activation_dropout`` and ``scale_embedding`` are read for
    completeness but unused: this module is inference-only and the reference never applies
    ``embed_scale``. ``conv_chunksize`` bounds how many chunks go through the convolutions at once.
    """

    num_mel_bins: int = 128
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    d_model: int = 1280
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation_function: str = "gelu"
    scale_embedding: bool = False
    initializer_range: float = 0.02
    max_source_positions: int = 1500
    n_window: int = 50
    output_dim: int = 3584
    n_window_infer: int = 800
    conv_chunksize: int = 500
    downsample_hidden_size: int = 480

    def __post_init__(self) -> None:
        if self.d_model % self.encoder_attention_heads or self.d_model % 2:
            raise ConfigError(
                f"d_model={self.d_model} must be even and divisible by "
                f"encoder_attention_heads={self.encoder_attention_heads}"
            )
        if self.activation_function not in _ACTIVATIONS:
            raise ConfigError(
                f"activation_function={self.activation_function!r} not in {sorted(_ACTIVATIONS)}"
            )
        if self.n_window < 1 or self.n_window_infer < 2 * self.n_window:
            raise ConfigError(
                f"need n_window >= 1 and n_window_infer >= 2 * n_window, got "
                f"n_window={self.n_window}, n_window_infer={self.n_window_infer}"
            )
        if downsampled_length(2 * self.n_window) > self.max_source_positions:
            raise ConfigError(
                f"a chunk of {2 * self.n_window} frames exceeds max_source_positions="
                f"{self.max_source_positions}"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AudioEncoderConfig:
        """Build from the ``audio_config`` dict (either spelling of :data:`AUDIO_ALIASES`); unknown keys are
        ignored, missing ones take defaults."""
        d = resolve_aliases(d, AUDIO_ALIASES)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})

    @property
    def tokens_per_window(self) -> int:
        """Attention window, in audio tokens: tokens of one chunk × ``n_window_infer // (2·n_window)``."""
        return downsampled_length(2 * self.n_window) * (self.n_window_infer // (2 * self.n_window))


def downsampled_length(frames: torch.Tensor | int) -> torch.Tensor | int:
    """Length after the three ``Conv2d(kernel 3, stride 2, padding 1)``: ``n → (n − 1) // 2 + 1``, thrice.

    ``frames``: int or int64 tensor (mel frames or mel bins). Zero maps to zero.
    """
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def audio_token_count(feature_lens: torch.Tensor | int, n_window: int = 50) -> torch.Tensor | int:
    """Audio tokens (``<|audio_pad|>`` positions) the encoder emits for ``feature_lens`` mel frames.

    Each full chunk of ``2·n_window`` frames gives ``downsampled_length(2·n_window)`` tokens (13 at the
    default 50) and the remainder gives ``downsampled_length(remainder)``. Equals ``transformers``'
    ``_get_feat_extract_output_lengths``, which hard-codes 13 tokens per chunk (so agrees with it only
    for ``n_window`` in 49..52, the range where a chunk yields 13 tokens).

    ``feature_lens``: int or int64 tensor ``[B]`` (frames). Returns the same type, tokens.
    """
    chunk = 2 * n_window
    return (feature_lens // chunk) * downsampled_length(chunk) + downsampled_length(feature_lens % chunk)


class _Windows(NamedTuple):
    """Attention windows over the flat token sequence ``[N]``, padded to ``W`` tokens each."""

    index: torch.Tensor  # int64 [num_windows, W]; padding points at row N (a zero row)
    key_mask: torch.Tensor  # bool [num_windows, 1, 1, W]; True = real token
    flat_valid: torch.Tensor  # int64 [N]; positions of real tokens in the flattened [num_windows * W]


def _windows(token_lens: torch.Tensor, window: int) -> _Windows:
    """Cut each utterance's tokens (``token_lens`` int64 ``[B]``) into windows of ``window`` tokens."""
    device = token_lens.device
    n_win = (token_lens + window - 1) // window  # [B]
    utt = torch.repeat_interleave(torch.arange(len(token_lens), device=device), n_win)
    first_win = torch.cumsum(n_win, 0) - n_win
    j = torch.arange(len(utt), device=device) - first_win[utt]
    tok_offset = torch.cumsum(token_lens, 0) - token_lens
    start = tok_offset[utt] + j * window
    length = torch.clamp(token_lens[utt] - j * window, max=window)  # [num_windows]
    width = int(length.max())
    pos = torch.arange(width, device=device)[None, :]
    real = pos < length[:, None]
    index = torch.where(real, start[:, None] + pos, int(token_lens.sum()))
    return _Windows(index, real[:, None, None, :], real.reshape(-1).nonzero().squeeze(1))


class AudioAttention(nn.Module):
    """Multi-head self-attention inside windows (Vaswani et al. 2017), biased q/k/v/out projections."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.num_heads, self.head_dim = cfg.encoder_attention_heads, d // cfg.encoder_attention_heads
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.q_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, windows: _Windows) -> torch.Tensor:
        """``x`` ``[N, d_model]`` → ``[N, d_model]``; scale ``head_dim^-0.5``."""
        n, d = x.shape
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qkv = torch.cat([qkv, qkv.new_zeros(1, 3 * d)])[windows.index]  # [nw, W, 3d]
        nw, w = windows.index.shape
        q, k, v = qkv.view(nw, w, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=windows.key_mask)  # [nw, H, W, hd]
        out = out.transpose(1, 2).reshape(nw * w, d)[windows.flat_valid]
        return self.out_proj(out)


class AudioEncoderLayer(nn.Module):
    """Pre-LN Transformer block: ``x + attn(LN(x))``, then ``x + fc2(act(fc1(LN(x))))``."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.self_attn = AudioAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.act = _ACTIVATIONS[cfg.activation_function]

    def forward(self, x: torch.Tensor, windows: _Windows) -> torch.Tensor:
        """``x`` ``[N, d_model]`` → ``[N, d_model]``."""
        x = x + self.self_attn(self.self_attn_layer_norm(x), windows)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


def sinusoid_positions(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's ``sinusoids``: float32 ``[length, channels]`` = ``[sin(p·τ_i) | cos(p·τ_i)]``,
    ``τ_i = max_timescale^(−i / (channels/2 − 1))`` (Radford et al. 2022, openai/whisper ``model.py``).
    """
    inv = torch.exp(-(math.log(max_timescale) / (channels // 2 - 1)) * torch.arange(channels // 2).float())
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class AudioEncoder(nn.Module):
    """Qwen3-Omni audio tower. ``state_dict()`` keys are the checkpoint's ``thinker.audio_tower.*``
    names with that prefix removed (``conv2d1.weight``, ``layers.0.self_attn.q_proj.weight``, ...).
    """

    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        self.config = cfg = config
        ch = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, ch, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        self.conv_out = nn.Linear(ch * downsampled_length(cfg.num_mel_bins), cfg.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.act = _ACTIVATIONS[cfg.activation_function]
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        self.register_buffer(
            "positional_embedding",
            sinusoid_positions(cfg.max_source_positions, cfg.d_model),
            persistent=False,
        )

    def forward(
        self, features: torch.Tensor, feature_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a right-padded batch of log-mel features.

        ``features``: float ``[B, num_mel_bins, T]`` (``LogMelFrontEnd`` output; frames ≥ a length are
        ignored); ``feature_lens``: int64 ``[B]``, 1 ≤ len ≤ T, in 10 ms mel frames.

        Returns ``(embeddings, out_lens)``: ``embeddings`` ``[N_total, output_dim]`` in the weights'
        dtype, the rows of utterance 0 first, then utterance 1, ...; ``out_lens`` int64 ``[B]`` =
        ``audio_token_count(feature_lens, n_window)``, summing to ``N_total``.

        Raises ValueError if ``features`` is not 3-D, has the wrong mel bin count, or a length is out
        of range.
        """
        cfg = self.config
        if features.dim() != 3 or features.shape[1] != cfg.num_mel_bins:
            raise ValueError(
                f"expected features [B, {cfg.num_mel_bins} mel bins, frames], "
                f"got shape {tuple(features.shape)}"
            )
        feature_lens = torch.as_tensor(feature_lens, dtype=torch.long, device=features.device)
        if feature_lens.shape != (features.shape[0],) or features.shape[0] == 0:
            raise ValueError(
                f"feature_lens must be int64 [B={features.shape[0]}] with B >= 1, "
                f"got shape {tuple(feature_lens.shape)}"
            )
        if int(feature_lens.min()) < 1 or int(feature_lens.max()) > features.shape[2]:
            raise ValueError(
                f"feature_lens must lie in [1, {features.shape[2]}], got {feature_lens.tolist()}"
            )

        x = self._embed_chunks(features, feature_lens)  # [N, d_model]
        out_lens = audio_token_count(feature_lens, cfg.n_window)
        windows = _windows(out_lens, cfg.tokens_per_window)
        for layer in self.layers:
            x = layer(x, windows)
        x = self.proj2(self.act(self.proj1(self.ln_post(x))))
        return x, out_lens

    def _embed_chunks(self, features: torch.Tensor, feature_lens: torch.Tensor) -> torch.Tensor:
        """Chunk, downsample and position-embed: ``[B, n_mels, T]`` → ``[N_total, d_model]``."""
        chunk = 2 * self.config.n_window
        device = features.device
        n_chunks = (feature_lens + chunk - 1) // chunk  # [B]
        utt = torch.repeat_interleave(torch.arange(len(feature_lens), device=device), n_chunks)
        j = torch.arange(len(utt), device=device) - (torch.cumsum(n_chunks, 0) - n_chunks)[utt]
        start = j * chunk
        chunk_len = torch.clamp(feature_lens[utt] - start, max=chunk)  # [C]
        # The width the reference pads this chunk to when its utterance is encoded alone.
        pad_width = torch.clamp(feature_lens[utt], max=chunk)  # [C]
        width = int(pad_width.max())
        pos = torch.arange(width, device=device)[None, :]
        frame = torch.clamp(start[:, None] + pos, max=features.shape[2] - 1)
        x = features.transpose(1, 2)[utt[:, None], frame]  # [C, width, n_mels]
        x = x.masked_fill((pos >= chunk_len[:, None])[:, :, None], 0.0)
        x = x.transpose(1, 2).unsqueeze(1).to(self.conv2d1.weight.dtype)  # [C, 1, n_mels, width]

        outs = []
        for i in range(0, x.shape[0], self.config.conv_chunksize):
            h, w = x[i : i + self.config.conv_chunksize], pad_width[i : i + self.config.conv_chunksize]
            for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
                h = F.gelu(conv(h))
                w = (w - 1) // 2 + 1
                # Zero what lies beyond this chunk's own padded width, as a shorter input would give.
                h = h * (torch.arange(h.shape[-1], device=device) < w[:, None]).to(h.dtype)[:, None, None, :]
            outs.append(h)
        h = torch.cat(outs)  # [C, ch, F', T']
        c, ch, f, t = h.shape
        h = self.conv_out(h.permute(0, 3, 1, 2).reshape(c, t, ch * f))
        h = h + self.positional_embedding[:t].to(h.dtype)
        keep = torch.arange(t, device=device)[None, :] < downsampled_length(chunk_len)[:, None]
        return h[keep]
