"""The decoder half of DAC (Kumar et al. 2023, "High-Fidelity Audio Compression with Improved RVQGAN").

Residual-VQ codes → waveform: per codebook an embedding lookup (``codebook_dim`` wide) and a 1×1
``out_proj`` conv back to ``hidden_size``, summed over codebooks; then the decoder: ``conv1`` (k=7),
one block per upsampling ratio ``s`` (Snake → ConvTranspose1d(k=2s, stride s, pad ⌈s/2⌉) → three
residual units with dilations 1, 3, 9), ``snake1``, ``conv2`` (k=7, one channel), tanh.

Parameter names are those of ``transformers``' ``DacModel.state_dict()`` (``quantizer.quantizers.{i}.
codebook.weight``, ``quantizer.quantizers.{i}.out_proj.weight``, ``decoder.conv1``, ``decoder.block.{i}.
{snake1,conv_t1,res_unit{1,2,3}.{snake1,conv1,snake2,conv2}}``, ``decoder.snake1``, ``decoder.conv2``);
the encoder and ``in_proj`` (encode-side) tensors are not part of this module (:mod:`.dac_encoder`
holds them). Weights are held plain; :func:`load_codec_into` folds weight-norm pairs (``weight_g``/
``weight_v`` in the original DAC and older ``transformers`` saves,
``parametrizations.weight.original0``/``original1`` after ``DacModel.apply_weight_norm()``) into
``weight = g · v / ‖v‖`` (norm over all dims but 0).

The decoder convolutions are centred, not causal: :mod:`.dac_stream` streams them exactly, with per-layer
state and the decoder's look-ahead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omniduplex.models.checkpoint import CheckpointError, iter_tensors
from omniduplex.models.config import ConfigError

RESIDUAL_DILATIONS = (1, 3, 9)


def codec_fields(d: dict[str, Any], need: list[str]) -> dict[str, Any]:
    """The ``need`` keys of a ``DacConfig`` dict plus ``sampling_rate`` (default 16000), with ``hidden_size``
    (latent channels) derived as ``DacConfig`` does: ``encoder_hidden_size · 2^len(downsampling_ratios)``.

    Raises:
        ConfigError: a needed key is missing.
    """
    d = dict(d)
    down = d.get("downsampling_ratios")
    if "hidden_size" not in d and down is not None and "encoder_hidden_size" in d:
        d["hidden_size"] = d["encoder_hidden_size"] * 2 ** len(down)
    missing = [k for k in need if k not in d]
    if missing:
        raise ConfigError(f"codec_config is missing {missing}")
    return {**{k: d[k] for k in need}, "sampling_rate": d.get("sampling_rate", 16000)}


@dataclass
class DacDecoderConfig:
    """The decode-side fields of a ``transformers`` ``DacConfig`` dict.

    ``hidden_size`` (latent channels) defaults to ``encoder_hidden_size · 2^len(downsampling_ratios)``
    and ``upsampling_ratios`` to the reversed ``downsampling_ratios``, as ``DacConfig`` derives them.
    ``hop_length`` = product of the ratios (samples per frame at ``sampling_rate`` Hz).
    """

    hidden_size: int
    decoder_hidden_size: int
    upsampling_ratios: list[int]
    n_codebooks: int
    codebook_size: int
    codebook_dim: int
    sampling_rate: int = 16000

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DacDecoderConfig:
        """Raises ``ConfigError`` when a field is missing or a channel count does not halve cleanly."""
        d = dict(d)
        down = d.get("downsampling_ratios")
        if "upsampling_ratios" not in d and down is not None:
            d["upsampling_ratios"] = list(down)[::-1]
        need = ["hidden_size", "decoder_hidden_size", "upsampling_ratios"]
        cfg = cls(**codec_fields(d, need + ["n_codebooks", "codebook_size", "codebook_dim"]))
        cfg.upsampling_ratios = [int(s) for s in cfg.upsampling_ratios]
        if cfg.decoder_hidden_size % 2 ** len(cfg.upsampling_ratios):
            raise ConfigError(
                f"codec decoder_hidden_size={cfg.decoder_hidden_size} is not divisible by "
                f"2^{len(cfg.upsampling_ratios)} (one halving per upsampling block)"
            )
        return cfg

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsampling_ratios)


class Snake1d(nn.Module):
    """Snake activation (Ziyin et al. 2020): ``x + sin²(α·x) / (α + 1e-9)``, ``alpha`` ``[1, C, 1]``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    """``x + conv2(snake2(conv1(snake1(x))))``; ``conv1`` k=7 with the given dilation, same-length padding."""

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake1d(channels)
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake1d(channels)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


class DecoderBlock(nn.Module):
    """Snake → ConvTranspose1d (``×stride``, channels halved) → residual units (dilations 1, 3, 9)."""

    def __init__(self, in_channels: int, stride: int) -> None:
        super().__init__()
        out = in_channels // 2
        self.snake1 = Snake1d(in_channels)
        self.conv_t1 = nn.ConvTranspose1d(
            in_channels, out, kernel_size=2 * stride, stride=stride, padding=math.ceil(stride / 2)
        )
        self.res_unit1 = ResidualUnit(out, RESIDUAL_DILATIONS[0])
        self.res_unit2 = ResidualUnit(out, RESIDUAL_DILATIONS[1])
        self.res_unit3 = ResidualUnit(out, RESIDUAL_DILATIONS[2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class DacDecoder(nn.Module):
    """Latents ``[B, hidden_size, T]`` → waveform ``[B, 1, samples]`` in (−1, 1)."""

    def __init__(self, cfg: DacDecoderConfig) -> None:
        super().__init__()
        ch = cfg.decoder_hidden_size
        self.conv1 = nn.Conv1d(cfg.hidden_size, ch, kernel_size=7, padding=3)
        self.block = nn.ModuleList(DecoderBlock(ch // 2**i, s) for i, s in enumerate(cfg.upsampling_ratios))
        out = ch // 2 ** len(cfg.upsampling_ratios)
        self.snake1 = Snake1d(out)
        self.conv2 = nn.Conv1d(out, 1, kernel_size=7, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return torch.tanh(self.conv2(self.snake1(x)))


class CodebookDecode(nn.Module):
    """One RVQ level's decode path: ``codebook`` ``[codebook_size, codebook_dim]`` and 1×1 ``out_proj``."""

    def __init__(self, cfg: DacDecoderConfig) -> None:
        super().__init__()
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.hidden_size, kernel_size=1)


class Quantizer(nn.Module):
    """``quantizers`` ``[n_codebooks]``; :meth:`from_codes` sums the projected codebook vectors."""

    def __init__(self, cfg: DacDecoderConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(CodebookDecode(cfg) for _ in range(cfg.n_codebooks))

    def from_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """int64 ``[B, S, T]`` (``S <= n_codebooks``, the first ``S`` levels) → latents ``[B, hidden, T]``."""
        out = 0
        for i in range(codes.shape[1]):
            q = self.quantizers[i]
            out = out + q.out_proj(q.codebook(codes[:, i]).transpose(1, 2))
        return out


class DacCodec(nn.Module):
    """DAC decoder: ``quantizer`` + ``decoder`` (the checkpoint's ``codec.*`` tensors minus the encoder)."""

    def __init__(self, cfg: DacDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = Quantizer(cfg)
        self.decoder = DacDecoder(cfg)

    @property
    def hop_length(self) -> int:
        return self.cfg.hop_length

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes int64 ``[B, S, T]`` (ids in ``[0, codebook_size)``) → waveform float ``[B, 1, L]``.

        ``L = output_length(T)``: ``T · hop_length`` when every upsampling ratio is even; each odd ratio
        drops one sample at its stage (``ConvTranspose1d`` padding ``⌈s/2⌉``, as in ``transformers``).

        Raises:
            ValueError: wrong rank, more streams than codebooks, or an id outside the codebook.
        """
        self.check_codes(codes)
        return self.decoder(self.quantizer.from_codes(codes))

    def check_codes(self, codes: torch.Tensor) -> None:
        """Raises ValueError unless ``codes`` is ``[B, S, T]`` with ``S <= n_codebooks`` and ids in
        ``[0, codebook_size)``."""
        if codes.dim() != 3:
            raise ValueError(f"codes must be [B, S, T], got shape {list(codes.shape)}")
        if codes.shape[1] > self.cfg.n_codebooks:
            raise ValueError(
                f"{codes.shape[1]} code streams for a codec with {self.cfg.n_codebooks} codebooks"
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"code ids must lie in [0, {self.cfg.codebook_size})")

    forward = decode

    def output_length(self, num_frames: int) -> int:
        """Samples :meth:`decode` returns for ``num_frames`` frames (see there)."""
        n = num_frames
        for s in self.cfg.upsampling_ratios:
            n = (n - 1) * s - 2 * math.ceil(s / 2) + 2 * s if n > 0 else 0
        return n


_WEIGHT_NORM = {
    ".weight_g": (".weight", "g"),
    ".weight_v": (".weight", "v"),
    ".parametrizations.weight.original0": (".weight", "g"),
    ".parametrizations.weight.original1": (".weight", "v"),
}
_ENCODE_SIDE = ("encoder.",)


def _is_encode_side(name: str) -> bool:
    return name.startswith(_ENCODE_SIDE) or (name.startswith("quantizer.") and ".in_proj." in name)


def fold_weight_norm(tensors: dict[str, torch.Tensor], where: str = "") -> dict[str, torch.Tensor]:
    """``tensors`` with each weight-norm pair folded into one float32 ``weight = g · v / ‖v‖`` (norm over
    every dim but 0, ``torch.nn.utils.weight_norm``'s): ``weight_g``/``weight_v`` or
    ``parametrizations.weight.original0``/``original1``; other tensors are returned as given.

    ``where`` prefixes error messages (a checkpoint prefix or ``"<file>: "``).

    Raises:
        CheckpointError: only one half of a weight-norm pair is present.
    """
    plain: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for n, t in tensors.items():
        suffix = next((s for s in _WEIGHT_NORM if n.endswith(s)), None)
        if suffix is None:
            plain[n] = t
        else:
            target, part = _WEIGHT_NORM[suffix]
            pairs.setdefault(n[: -len(suffix)] + target, {})[part] = t
    for target, gv in pairs.items():
        if set(gv) != {"g", "v"}:
            raise CheckpointError(f"weight-norm tensor '{where}{target}' has only its {sorted(gv)} half")
        plain[target] = torch._weight_norm(gv["v"].float(), gv["g"].float(), 0)
    return plain


def read_codec_tensors(
    files: dict[str, Path], prefix: str, keep: Callable[[str], bool]
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors ``prefix + name`` with ``keep(name)``, keyed by ``name``, weight-norm folded
    (:func:`fold_weight_norm`).

    Raises:
        CheckpointError: only one half of a weight-norm pair is present.
    """
    names = [n[len(prefix) :] for n in files if n.startswith(prefix)]
    names = [n for n in names if keep(n)]
    loaded = dict(iter_tensors(files, [prefix + n for n in names]))
    return fold_weight_norm({n: loaded[prefix + n] for n in names}, prefix)


def copy_codec_tensors(
    module: nn.Module,
    plain: dict[str, torch.Tensor],
    prefix: str,
    part: str,
    config_key: str = "codec_config",
    where: str = "",
) -> None:
    """Copy ``plain`` (from :func:`read_codec_tensors`) into ``module``'s parameters by name, strictly.

    ``part`` names the module in errors ("codec decoder", "AudioVAE"), ``config_key`` the ``config.json``
    section that sized it, ``where`` (e.g. ``"audiovae.pth: "``) the file; ``prefix`` is put before tensor
    names. Every ``module`` tensor must be present.

    Raises:
        CheckpointError: a tensor of ``plain`` is not in ``module`` (config and weights disagree), or
            one of ``module``'s is missing or mis-shaped; the message names the tensor.
    """
    ours = module.state_dict()
    unexpected = sorted(set(plain) - set(ours))
    if unexpected:
        raise CheckpointError(
            f"{where}checkpoint tensor '{prefix}{unexpected[0]}' is not part of the {part} {config_key} "
            f"describes ({len(unexpected)} such tensors) — {config_key} and weights disagree"
        )
    for name, param in ours.items():
        if name not in plain:
            raise CheckpointError(
                f"{where}missing tensor '{prefix}{name}' (expected shape {list(param.shape)})"
            )
        t = plain[name]
        if tuple(t.shape) != tuple(param.shape):
            raise CheckpointError(
                f"{where}tensor '{prefix}{name}' has shape {list(t.shape)}, {config_key} implies "
                f"{list(param.shape)}"
            )
        with torch.no_grad():
            param.copy_(t.to(param.dtype))


def load_codec_into(codec: DacCodec, files: dict[str, Path], prefix: str = "codec.") -> None:
    """Fill ``codec`` from checkpoint tensors ``prefix + name`` (names of ``DacModel.state_dict()``).

    Encode-side tensors (``encoder.*``, ``quantizer.quantizers.{i}.in_proj.*``) are ignored; weight-norm
    pairs are folded (module docstring).

    Raises:
        CheckpointError: a tensor is missing, mis-shaped, half of a weight-norm pair, or not part of the
            decoder the config describes.
    """
    plain = read_codec_tensors(files, prefix, lambda n: not _is_encode_side(n))
    copy_codec_tensors(codec, plain, prefix, "codec decoder")
