"""VoxCPM2's causal AudioVAE: 16 kHz waveform → 25 Hz latents (encoder, for reference clips) and latents →
48 kHz waveform (decoder).

A DAC-style convolutional autoencoder (Kumar et al. 2023) made causal: every convolution pads on the left
only (``2·padding − output_padding`` samples; ``(k−1)·dilation`` for the stride-1 ones), every transposed
convolution drops the same count at its right end, so output sample ``n`` depends on inputs up to ``n``.
Encoder: conv k7, one block per ``encoder_rates`` entry (three residual units, dilations 1/3/9, Snake,
strided conv k=2s, channels doubled), ``fc_mu`` (k3; ``fc_logvar`` is loaded but unused: the latents are the
posterior mean). Decoder: conv k7 (depthwise k7 + pointwise when ``depthwise``), one block per
``decoder_rates`` entry (Snake, transposed conv k=2s stride s, channels halved, three residual units),
Snake, conv k7 to one channel, tanh; before each block a per-channel scale and bias chosen by the output
rate's bucket (``sr_bin_boundaries``, "scale_bias" conditioning).

Source: ``voxcpm`` 2.0.3 ``modules/audiovae/audio_vae_v2.py``. Tensor names are those of its state dict
(``audiovae.safetensors`` / ``audiovae.pth``): ``encoder.block.N…``, ``encoder.fc_mu``, ``decoder.model.N…``,
``decoder.sr_cond_model.N.{scale,bias}_embed.weight``, ``decoder.sr_bin_boundaries``; convolutions are
weight-normalised there (``weight_g`` / ``weight_v``) and folded into a plain ``weight`` at load
(:func:`~omniduplex.models.codecs.dac.read_codec_tensors`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.codecs.dac import Snake1d
from omniduplex.models.voxcpm2.config import AudioVAEConfig

DILATIONS = (1, 3, 9)


class CausalConv(nn.Conv1d):
    """``nn.Conv1d`` after ``left`` zeros of padding (none on the right)."""

    def __init__(self, cin: int, cout: int, k: int, *, left: int, stride=1, dilation=1, groups=1, bias=True):
        super().__init__(cin, cout, k, stride=stride, dilation=dilation, groups=groups, bias=bias)
        self.left = left

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.left, 0)))


class CausalConvT(nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` (no padding) with the last ``trim`` output samples dropped."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, trim: int) -> None:
        super().__init__(cin, cout, k, stride=stride)
        self.trim = trim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y[..., : y.shape[-1] - self.trim]


def _strided(cin: int, cout: int, stride: int, transpose: bool) -> nn.Module:
    """The k=2s stride-s (transposed) conv of a block: padding ⌈s/2⌉, output padding s mod 2 (causal: s)."""
    edge = 2 * math.ceil(stride / 2) - stride % 2
    if transpose:
        return CausalConvT(cin, cout, 2 * stride, stride, edge)
    return CausalConv(cin, cout, 2 * stride, left=edge, stride=stride)


class ResidualUnit(nn.Module):
    """``x + conv1x1(snake(conv7_dilated(snake(x))))``; ``block`` = [Snake, conv k7, Snake, conv k1]."""

    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim),
            CausalConv(dim, dim, 7, left=6 * dilation, dilation=dilation, groups=groups),
            Snake1d(dim),
            CausalConv(dim, dim, 1, left=0),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class EncoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        units = [ResidualUnit(cin, d, groups) for d in DILATIONS]
        self.block = nn.Sequential(*units, Snake1d(cin), _strided(cin, cout, stride, transpose=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    """Waveform ``[B, 1, n]`` (``n`` a multiple of the hop) → posterior mean ``[B, latent_dim, n / hop]``."""

    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        d = cfg.encoder_dim
        layers: list[nn.Module] = [CausalConv(1, d, 7, left=6)]
        for s in cfg.encoder_rates:
            layers.append(EncoderBlock(d, 2 * d, s, d if cfg.depthwise else 1))
            d *= 2
        self.block = nn.Sequential(*layers)
        self.fc_mu = CausalConv(d, cfg.latent_dim, 3, left=2)
        self.fc_logvar = CausalConv(d, cfg.latent_dim, 3, left=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_mu(self.block(x))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        units = [ResidualUnit(cout, d, groups) for d in DILATIONS]
        self.block = nn.Sequential(Snake1d(cin), _strided(cin, cout, stride, transpose=True), *units)
        self.input_channels = cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class RateCondition(nn.Module):
    """Per-channel ``x · scale[b] + bias[b]`` (or ``x + cond[b]`` for ``add``) for the output-rate bucket
    ``b`` (``SampleRateConditionLayer``); tables ``[buckets, C]``."""

    def __init__(self, channels: int, buckets: int, cond_type: str) -> None:
        super().__init__()
        self.kind = "add" if cond_type == "add" else "scale_bias"
        if self.kind == "add":
            self.cond_embed = nn.Embedding(buckets, channels)
        else:
            self.scale_embed = nn.Embedding(buckets, channels)
            self.bias_embed = nn.Embedding(buckets, channels)
        self.bucket = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "add":
            return x + self.cond_embed.weight[self.bucket][None, :, None]
        return (
            x * self.scale_embed.weight[self.bucket][None, :, None]
            + self.bias_embed.weight[self.bucket][None, :, None]
        )


class Decoder(nn.Module):
    """Latents ``[B, latent_dim, T]`` → waveform ``[B, 1, T · decode_hop]`` in (−1, 1) at the output rate.

    ``model``: the layers in order; ``sr_cond_model[i]``: the rate condition applied before layer ``i``
    (before each upsampling block; ``None`` elsewhere, or everywhere without ``sr_bin_boundaries``).
    """

    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        ch, lat = cfg.decoder_dim, cfg.latent_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [
                CausalConv(lat, lat, 7, left=6, groups=lat),
                CausalConv(lat, ch, 1, left=0),
            ]
        else:
            layers = [CausalConv(lat, ch, 7, left=6)]
        for i, s in enumerate(cfg.decoder_rates):
            cout = ch // 2 ** (i + 1)
            layers.append(DecoderBlock(ch // 2**i, cout, s, cout if cfg.depthwise else 1))
        layers += [Snake1d(cout), CausalConv(cout, 1, 7, left=6), nn.Tanh()]
        self.model = nn.ModuleList(layers)
        conds: list[nn.Module | None] = [None] * len(layers)
        if cfg.sr_bin_boundaries is not None:
            self.register_buffer("sr_bin_boundaries", torch.tensor(cfg.sr_bin_boundaries, dtype=torch.int32))
            buckets = len(cfg.sr_bin_boundaries) + 1
            bucket = sum(
                cfg.out_sample_rate > b for b in cfg.sr_bin_boundaries
            )  # torch.bucketize, right=False
            for i, layer in enumerate(layers):
                if isinstance(layer, DecoderBlock):
                    conds[i] = RateCondition(layer.input_channels, buckets, cfg.cond_type)
                    conds[i].bucket = bucket
        self.sr_cond_model = nn.ModuleList(conds)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = z
        for layer, cond in zip(self.model, self.sr_cond_model):
            if cond is not None:
                x = cond(x)
            x = layer(x)
        return x


class AudioVAE(nn.Module):
    """The encoder and decoder of one checkpoint's ``audio_vae_config``."""

    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    @torch.no_grad()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """Waveform ``[B, n]`` or ``[B, 1, n]`` at ``sample_rate`` (16 kHz) → latents ``[B, latent_dim,
        ⌈n / hop⌉]`` (zeros appended up to a whole frame, as ``AudioVAE.preprocess``)."""
        x = wav[:, None] if wav.dim() == 2 else wav
        hop = self.cfg.hop_length
        x = F.pad(x, (0, -x.shape[-1] % hop))
        w = self.decoder.model[0].weight
        return self.encoder(x.to(device=w.device, dtype=w.dtype))

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, latent_dim, T]`` → waveform ``[B, 1, T · decode_hop]`` at ``out_sample_rate``."""
        return self.decoder(z)
