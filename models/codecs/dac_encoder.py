"""The encoder half of DAC (Kumar et al. 2023, "High-Fidelity Audio Compression with Improved RVQGAN").

Waveform → residual-VQ codes. The encoder (paper §3, Fig. 1; the mirror of :mod:`.dac`'s decoder):
``conv1`` (1 → ``encoder_hidden_size`` channels, k=7), one block per downsampling ratio ``s`` (three
residual units with dilations 1, 3, 9 → Snake → Conv1d(k=2s, stride s, pad ⌈s/2⌉), channels doubled),
``snake1``, ``conv2`` (k=3, → ``hidden_size``). Then residual vector quantisation (paper §3.2, with the
improved-VQGAN factorised, L2-normalised codes of Yu et al. 2021): for each level ``i`` the residual
(initially the encoder output) is projected by a 1×1 ``in_proj`` to ``codebook_dim``, each frame's
vector and every codebook row are L2-normalised, the code is the row of maximum cosine similarity,
and ``out_proj(codebook[code])`` (the decode-side path of :mod:`.dac`) is subtracted from the residual.

Parameter names are those of ``transformers``' ``DacModel.state_dict()``: ``encoder.conv1``,
``encoder.block.{i}.{res_unit{1,2,3}.{snake1,conv1,snake2,conv2},snake1,conv1}``, ``encoder.snake1``,
``encoder.conv2`` and ``quantizer.quantizers.{i}.{in_proj,out_proj,codebook}``. Weight-norm pairs are
folded at load time as in :func:`.dac.load_codec_into`.

Input length: DAC's ``preprocess`` (and ``transformers``' ``DacFeatureExtractor``) right-pads the
waveform with zeros to a multiple of ``hop_length``; :meth:`DacCodecEncoder.encode` does the same, so
``L`` samples give ``ceil(L / hop_length)`` frames (every ratio >= 2; see
:meth:`DacCodecEncoder.num_frames`). ``DacModel.encode`` itself does not pad. The convolutions are
centred, so a frame depends on samples on both sides (and the last frame on the padding zeros).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.codecs.dac import (
    RESIDUAL_DILATIONS,
    ResidualUnit,
    Snake1d,
    codec_fields,
    copy_codec_tensors,
    read_codec_tensors,
)
from omniduplex.models.config import ConfigError


@dataclass
class DacEncoderConfig:
    """The encode-side fields of a ``transformers`` ``DacConfig`` dict (the unified ``codec_config``).

    ``hidden_size`` (latent channels) defaults to ``encoder_hidden_size · 2^len(downsampling_ratios)``,
    as ``DacConfig`` derives it. ``hop_length`` = product of the ratios (samples per frame at
    ``sampling_rate`` Hz).
    """

    encoder_hidden_size: int
    downsampling_ratios: list[int]
    hidden_size: int
    n_codebooks: int
    codebook_size: int
    codebook_dim: int
    sampling_rate: int = 16000

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DacEncoderConfig:
        """Raises ``ConfigError`` when a field is missing or a downsampling ratio is not a positive int."""
        need = ["encoder_hidden_size", "downsampling_ratios", "hidden_size"]
        cfg = cls(**codec_fields(d, need + ["n_codebooks", "codebook_size", "codebook_dim"]))
        cfg.downsampling_ratios = [int(s) for s in cfg.downsampling_ratios]
        if not cfg.downsampling_ratios or min(cfg.downsampling_ratios) < 1:
            raise ConfigError(f"codec downsampling_ratios={cfg.downsampling_ratios} must be positive ints")
        return cfg

    @property
    def hop_length(self) -> int:
        return math.prod(self.downsampling_ratios)


class EncoderBlock(nn.Module):
    """Residual units (dilations 1, 3, 9) → Snake → Conv1d (``÷stride`` in time, channels doubled)."""

    def __init__(self, in_channels: int, stride: int) -> None:
        super().__init__()
        self.res_unit1 = ResidualUnit(in_channels, RESIDUAL_DILATIONS[0])
        self.res_unit2 = ResidualUnit(in_channels, RESIDUAL_DILATIONS[1])
        self.res_unit3 = ResidualUnit(in_channels, RESIDUAL_DILATIONS[2])
        self.snake1 = Snake1d(in_channels)
        self.conv1 = nn.Conv1d(
            in_channels, 2 * in_channels, kernel_size=2 * stride, stride=stride, padding=math.ceil(stride / 2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.res_unit3(self.res_unit2(self.res_unit1(x)))
        return self.conv1(self.snake1(x))


class DacEncoder(nn.Module):
    """Waveform ``[B, 1, L]`` → latents ``[B, hidden_size, T]`` (``T = L / hop`` for ``L`` a multiple)."""

    def __init__(self, cfg: DacEncoderConfig) -> None:
        super().__init__()
        ch = cfg.encoder_hidden_size
        self.conv1 = nn.Conv1d(1, ch, kernel_size=7, padding=3)
        self.block = nn.ModuleList(EncoderBlock(ch * 2**i, s) for i, s in enumerate(cfg.downsampling_ratios))
        out = ch * 2 ** len(cfg.downsampling_ratios)
        self.snake1 = Snake1d(out)
        self.conv2 = nn.Conv1d(out, cfg.hidden_size, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


class CodebookEncode(nn.Module):
    """One RVQ level: ``in_proj`` (hidden → codebook_dim, 1×1), ``codebook``, ``out_proj`` (back, 1×1)."""

    def __init__(self, cfg: DacEncoderConfig) -> None:
        super().__init__()
        self.in_proj = nn.Conv1d(cfg.hidden_size, cfg.codebook_dim, kernel_size=1)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.hidden_size, kernel_size=1)
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)

    def forward(self, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual ``[B, hidden, T]`` → (codes int64 ``[B, T]``, quantized ``[B, hidden, T]``).

        The code maximises the cosine similarity between ``in_proj(residual)`` and the codebook rows
        (both L2-normalised, eps 1e-12), computed in float32 whatever the parameter dtype.
        """
        z = F.normalize(self.in_proj(residual).transpose(1, 2).float(), dim=-1)  # [B, T, D]
        book = F.normalize(self.codebook.weight.float(), dim=-1)  # [N, D]
        codes = (z @ book.t()).argmax(dim=-1)  # [B, T]
        return codes, self.out_proj(self.codebook(codes).transpose(1, 2))


class ResidualQuantizer(nn.Module):
    """``quantizers`` ``[n_codebooks]``; :meth:`forward` quantizes the first ``n_q`` levels."""

    def __init__(self, cfg: DacEncoderConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(CodebookEncode(cfg) for _ in range(cfg.n_codebooks))

    def forward(self, latents: torch.Tensor, n_q: int) -> torch.Tensor:
        """Latents ``[B, hidden, T]`` → codes int64 ``[B, n_q, T]`` (level ``i`` codes the residual left
        after levels ``< i``)."""
        residual, codes = latents, []
        for q in self.quantizers[:n_q]:
            c, quantized = q(residual)
            codes.append(c)
            residual = residual - quantized
        return torch.stack(codes, dim=1)


class DacCodecEncoder(nn.Module):
    """DAC encode side: ``encoder`` + ``quantizer`` (``in_proj``, and ``codebook``/``out_proj`` shared in
    name, not in memory, with :class:`.dac.DacCodec`), loaded by :func:`load_codec_encoder_into`."""

    def __init__(self, cfg: DacEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = DacEncoder(cfg)
        self.quantizer = ResidualQuantizer(cfg)

    @property
    def hop_length(self) -> int:
        return self.cfg.hop_length

    def num_frames(self, num_samples: int) -> int:
        """Frames :meth:`encode` returns for ``num_samples`` samples: the input is right-padded to
        ``P = ceil(L / hop) · hop`` and each stride-``s`` conv (k=2s, pad ⌈s/2⌉) maps ``n`` to
        ``⌊(n + 2⌈s/2⌉ − 2s) / s⌋ + 1``, which is ``n / s`` for ``s >= 2``: so ``ceil(L / hop)``."""
        n = math.ceil(num_samples / self.hop_length) * self.hop_length
        for s in self.cfg.downsampling_ratios:
            n = (n + 2 * math.ceil(s / 2) - 2 * s) // s + 1
        return n

    def _padded(self, wav: torch.Tensor) -> torch.Tensor:
        if wav.dim() != 3 or wav.shape[1] != 1:
            raise ValueError(f"wav must be [B, 1, samples], got shape {list(wav.shape)}")
        if wav.shape[-1] == 0:
            raise ValueError("wav has no samples")
        if not wav.is_floating_point():
            raise ValueError(f"wav must be floating point, got {wav.dtype}")
        weight = self.encoder.conv1.weight
        wav = wav.to(device=weight.device, dtype=weight.dtype)
        return F.pad(wav, (0, -wav.shape[-1] % self.hop_length))

    def encode_latents(self, wav: torch.Tensor) -> torch.Tensor:
        """Waveform float ``[B, 1, L]`` (at ``sampling_rate`` Hz, nominally in [−1, 1]) → continuous
        encoder output ``[B, hidden_size, num_frames(L)]`` in the parameter dtype, before quantisation.

        Raises:
            ValueError: not ``[B, 1, L]``, ``L == 0``, or not floating point.
        """
        return self.encoder(self._padded(wav))

    def encode(self, wav: torch.Tensor, n_q: int | None = None) -> torch.Tensor:
        """Waveform float ``[B, 1, L]`` at ``sampling_rate`` Hz → codes int64 ``[B, n_q, T]``.

        ``T = ceil(L / hop_length)`` (zero right-padding, module docstring); ids in ``[0, codebook_size)``.
        ``n_q`` (default ``n_codebooks``) keeps the first levels, as ``DacModel.encode(n_quantizers=n_q)``
        does (the unified LM uses the first ``num_streams``). :meth:`.dac.DacCodec.decode` inverts it.

        Raises:
            ValueError: bad ``wav`` (see :meth:`encode_latents`) or ``n_q`` outside ``[1, n_codebooks]``.
        """
        n_q = self.cfg.n_codebooks if n_q is None else n_q
        if not 1 <= n_q <= self.cfg.n_codebooks:
            raise ValueError(f"n_q={n_q} outside [1, {self.cfg.n_codebooks}] for this codec")
        return self.quantizer(self.encode_latents(wav), n_q)

    forward = encode


def _is_encoder_tensor(name: str) -> bool:
    return name.startswith(("encoder.", "quantizer."))


def load_codec_encoder_into(module: DacCodecEncoder, files: dict[str, Path], prefix: str = "codec.") -> None:
    """Fill ``module`` from checkpoint tensors ``prefix + name`` (names of ``DacModel.state_dict()``).

    Reads ``encoder.*`` and every ``quantizer.quantizers.{i}.*`` tensor (``in_proj``, plus ``codebook``
    and ``out_proj`` for the residual update); decoder tensors are ignored. Weight-norm pairs are folded.

    Raises:
        CheckpointError: a tensor is missing (the message names it and its expected shape), mis-shaped,
            half of a weight-norm pair, or not part of the encoder the config describes (e.g. a
            quantizer level beyond ``n_codebooks``).
    """
    plain = read_codec_tensors(files, prefix, _is_encoder_tensor)
    copy_codec_tensors(module, plain, prefix, "codec encoder")
