"""The decoder half of the Higgs audio tokenizer (``transformers``' ``HiggsAudioV2TokenizerModel.decode``).

Codes int64 ``[B, Q, T]`` (``Q <= num_quantizers``, ids in ``[0, codebook_size)``) → 24 kHz waveform:

1. residual VQ decode: per level ``i`` a codebook lookup (``quantizer.quantizers.{i}.codebook.embed``
   ``[codebook_size, codebook_dim]``) and ``project_out`` (Linear ``codebook_dim → hidden_size``), summed;
2. ``fc2`` (Linear ``hidden_size → acoustic hidden_size``): the acoustic half of the latent;
3. the acoustic DAC decoder (``acoustic_decoder.*``, names of ``transformers``' ``DacModel.decoder``) as
   ``HiggsAudioV2TokenizerModel._adjust_dac_decoder`` changes it: every ``ConvTranspose1d`` gets
   ``output_padding = stride % 2`` (so each block multiplies the length exactly by its stride: ``T · hop``
   samples out) and the final ``tanh`` is removed.

Encode-side tensors (``acoustic_encoder``, ``encoder_semantic``, ``semantic_model``, ``fc``, ``fc1``,
``project_in``, the codebooks' EMA buffers) and the training-only ``decoder_semantic`` are not loaded.
Weight-norm pairs are folded (:func:`omniduplex.models.codecs.dac.read_codec_tensors`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.codecs.dac import DacDecoder, DacDecoderConfig, copy_codec_tensors, read_codec_tensors
from omniduplex.models.higgs.config import HiggsCodecConfig


class AcousticDecoder(DacDecoder):
    """DAC's decoder with Higgs' two changes (module docstring): exact ``×stride`` transposed convs and no
    tanh."""

    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__(
            DacDecoderConfig(
                hidden_size=cfg.acoustic_hidden_size,
                decoder_hidden_size=cfg.decoder_hidden_size,
                upsampling_ratios=cfg.upsampling_ratios,
                n_codebooks=cfg.num_quantizers,
                codebook_size=cfg.codebook_size,
                codebook_dim=cfg.codebook_dim,
                sampling_rate=cfg.sample_rate,
            )
        )
        for block in self.block:
            block.conv_t1.output_padding = (block.conv_t1.stride[0] % 2,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


class _Codebook(nn.Module):
    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.zeros(cfg.codebook_size, cfg.codebook_dim))


class _Level(nn.Module):
    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.codebook = _Codebook(cfg)
        self.project_out = nn.Linear(cfg.codebook_dim, cfg.hidden_size)


class ResidualVQ(nn.Module):
    """``quantizers`` ``[num_quantizers]``; :meth:`decode` sums the projected codebook vectors."""

    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(_Level(cfg) for _ in range(cfg.num_quantizers))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """int64 ``[B, Q, T]`` → ``[B, T, hidden_size]`` (the first ``Q`` levels)."""
        out = 0
        for i in range(codes.shape[1]):
            q = self.quantizers[i]
            out = out + q.project_out(nn.functional.embedding(codes[:, i], q.codebook.embed))
        return out


class HiggsCodecDecoder(nn.Module):
    """``quantizer`` + ``fc2`` + ``acoustic_decoder`` (module docstring)."""

    def __init__(self, cfg: HiggsCodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = ResidualVQ(cfg)
        self.fc2 = nn.Linear(cfg.hidden_size, cfg.acoustic_hidden_size)
        self.acoustic_decoder = AcousticDecoder(cfg)

    @property
    def hop_length(self) -> int:
        """Samples per frame (960 at 24 kHz / 25 Hz for the published tokenizer)."""
        return self.cfg.hop_length

    def check_codes(self, codes: torch.Tensor) -> None:
        """Raises ValueError unless ``codes`` is ``[B, Q, T]``, ``Q <= num_quantizers``, ids in range."""
        if codes.dim() != 3:
            raise ValueError(f"codes must be [B, Q, T], got shape {list(codes.shape)}")
        if codes.shape[1] > self.cfg.num_quantizers:
            raise ValueError(
                f"{codes.shape[1]} code streams for a codec with {self.cfg.num_quantizers} quantizers"
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"code ids must lie in [0, {self.cfg.codebook_size})")

    def latents(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, Q, T]`` → acoustic latents ``[B, acoustic_hidden, T]`` (per frame: no context)."""
        return self.fc2(self.quantizer.decode(codes.long())).transpose(1, 2)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes int64 ``[B, Q, T]`` → waveform float ``[B, 1, T · hop_length]`` at ``sample_rate`` Hz.

        Raises:
            ValueError: as :meth:`check_codes`.
        """
        self.check_codes(codes)
        return self.acoustic_decoder(self.latents(codes))

    forward = decode


_DECODE_SIDE = ("quantizer.", "fc2.", "acoustic_decoder.")


def load_codec(codec: HiggsCodecDecoder, files: dict[str, Path]) -> None:
    """Fill ``codec`` from the tokenizer checkpoint's tensors (names of ``HiggsAudioV2TokenizerModel``).

    Raises:
        CheckpointError: a decoder tensor is missing, mis-shaped, or half of a weight-norm pair.
    """
    ours = set(codec.state_dict())

    def keep(name: str) -> bool:
        base = name.replace(".parametrizations.weight.original0", ".weight")
        base = base.replace(".parametrizations.weight.original1", ".weight")
        base = base.replace(".weight_g", ".weight").replace(".weight_v", ".weight")
        return name.startswith(_DECODE_SIDE) and base in ours

    plain = read_codec_tensors(files, "", keep)
    try:
        copy_codec_tensors(codec, plain, "", "codec decoder")
    except CheckpointError as e:
        raise CheckpointError(f"audio tokenizer: {e}") from e
