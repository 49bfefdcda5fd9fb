"""The 12 Hz codec decoder of Qwen3-TTS (``speech_tokenizer/``, ``Qwen3TTSTokenizerV2Model.decoder``):
16 codebooks of codes at 12.5 frames/s → 24 kHz waveform, 1920 samples per frame.

Tensor names follow the published ``decoder.*`` weights of Qwen/Qwen3-TTS-12Hz-*/speech_tokenizer:

1. ``quantizer``: split residual VQ (Défossez et al. 2024, Mimi): codebook 0 (semantic) through
   ``rvq_first``, codebooks 1..15 (acoustic) through ``rvq_rest``. Each codebook is stored as
   ``embedding_sum / cluster_usage`` (EMA k-means statistics); a group sums its codebooks' vectors
   (``codebook_dim / 2`` wide) and projects them with a bias-free 1×1 conv to ``codebook_dim``; the two
   groups are added.
2. ``pre_conv``: causal conv, kernel 3, ``codebook_dim → latent_dim``.
3. ``pre_transformer``: ``input_proj`` (latent → hidden), the sliding-window causal transformer of
   Qwen3-Omni's Code2Wav (window 72 frames, RoPE, SwiGLU, layer scale), final norm, ``output_proj``.
4. ``upsample`` (transposed conv ×2 + ConvNeXt, twice) and ``decoder`` (SnakeBeta/DAC blocks at rates
   8, 5, 4, 3): Qwen3-Omni's Code2Wav conv stack on ``latent_dim`` channels, except that the decoder
   blocks' transposed convs (kernel ``2·rate``) are trimmed on the right only, so ``F`` frames give
   exactly ``F · 1920`` samples (the last samples of a span change once the next frame is known).

Every layer is causal (the right-trimmed transposed convs included: input ``i`` writes output samples
``[i·rate, (i + 2)·rate)`` and the last ``rate`` are trimmed), so frame ``f``'s samples
``[f·1920, (f + 1)·1920)`` depend on frames ``<= f`` only and never change: :mod:`.codec_stream` streams
the decoder with per-layer state, each frame decoded once, equal to the one-shot decode.

The reference does not stream; it decodes windows of codes with left context
(``chunked_decode``). :func:`chunked_decode` does the same with any first-chunk / chunk / context sizes
(parity with the reference; with 72 frames of context it differs from the one-shot decode, as the
transformer alone reaches ``layers · 71`` frames back).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from omniduplex.models.qwen3_omni.code2wav import (
    CausalConv1d,
    CausalTransConv1d,
    ConvNeXtBlock,
    DecoderBlock,
    PreTransformer,
    SnakeBeta,
)
from omniduplex.models.qwen3_omni.code2wav_config import Code2WavConfig
from omniduplex.models.qwen3_tts.config import CodecDecoderConfig

STREAM_FIRST_CHUNK = 1
STREAM_CHUNK = 25
STREAM_LEFT_CONTEXT = 72
"""Streaming schedule of vLLM-Omni's Qwen3-TTS decoder stage: a 1-frame first chunk, then 25-frame
chunks, each decoded with up to 72 frames of left context (issue 25). Our stream
(:mod:`.codec_stream`) keeps state instead of a left context and uses only the chunk sizes."""


class RightTrimTransConv1d(CausalTransConv1d):
    """Transposed conv with ``kernel − stride`` samples trimmed on the right only:
    ``[B, C_in, L] → [B, C_out, L·stride]`` for ``kernel == 2·stride``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim]

    def output_length(self, n: int) -> int:
        return (n - 1) * self.stride + self.kernel - self.trim

    @property
    def crops(self) -> tuple[int, int]:
        return 0, self.trim


class Codebook(nn.Module):
    """One VQ codebook stored as EMA statistics: vector ``k`` is ``embedding_sum[k] / max(cluster_usage[k],
    1e-5)`` (``[size, dim]``)."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def vectors(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Vectors of int ``ids`` ``[...]`` → ``[..., dim]``: rows of :meth:`vectors`, dividing only the rows
        asked for (the same numbers; a stream's frame reads 16 rows, not 16 × 2048)."""
        return self.embedding_sum[ids] / self.cluster_usage[ids].clamp(min=1e-5)[..., None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class _LayerList(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class ResidualVQ(nn.Module):
    """``n`` codebooks of ``dim``-wide vectors with 1×1 conv projections to/from ``io_dim`` (no bias)."""

    def __init__(self, n: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.vq = _LayerList(n, size, dim)
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # used by the encoder side only
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """int ``[B, n, F]`` → ``[B, io_dim, F]``: codebook vectors summed in codebook order, projected."""
        total = None
        for i, layer in enumerate(self.vq.layers):
            v = layer._codebook.lookup(codes[:, i]).transpose(1, 2)
            total = v if total is None else total + v
        return self.output_proj(total)


class SplitResidualVQ(nn.Module):
    """Codebook 0 through ``rvq_first``, codebooks ``1..n−1`` through ``rvq_rest``; outputs added."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualVQ(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualVQ(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class FrameTransformer(PreTransformer):
    """Qwen3-Omni's sliding-window frame transformer between ``input_proj`` and ``output_proj``."""

    def __init__(self, cfg: Code2WavConfig, latent_dim: int) -> None:
        super().__init__(cfg)
        self.input_proj = nn.Linear(latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, latent_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, F, latent] → [B, F, latent]``, positions 0..F−1."""
        return self.output_proj(super().forward(self.input_proj(x)))


class CodecDecoder(nn.Module):
    """Codes int ``[B, num_quantizers, F]`` → 24 kHz waveform ``[B, 1, F · total_upsample]`` in [-1, 1].

    ``state_dict()`` keys are the published ``decoder.*`` names without the prefix.
    """

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        lat = cfg.latent_dim
        self.quantizer = SplitResidualVQ(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, lat, 3)
        self.pre_transformer = FrameTransformer(cfg, lat)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv1d(lat, lat, f, f), ConvNeXtBlock(lat)])
            for f in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim >> i for i in range(len(cfg.upsample_rates) + 1)]
        blocks = []
        for i, r in enumerate(cfg.upsample_rates):
            block = DecoderBlock(dims[i], dims[i + 1], r)
            block.block[1] = RightTrimTransConv1d(dims[i], dims[i + 1], 2 * r, r)
            blocks.append(block)
        self.decoder = nn.ModuleList(
            [
                CausalConv1d(lat, cfg.decoder_dim, 7),
                *blocks,
                SnakeBeta(dims[-1]),
                CausalConv1d(dims[-1], 1, 7),
            ]
        )

    @property
    def total_upsample(self) -> int:
        """Samples per frame (1920 = 24 kHz / 12.5 Hz for the published rates)."""
        return math.prod(self.cfg.upsampling_ratios) * math.prod(self.cfg.upsample_rates)

    def check_codes(self, codes: torch.Tensor) -> None:
        """Raises ValueError on a wrong shape/dtype, no frames, or an id outside ``[0, codebook_size)``
        (naming the codebook, frame and bound)."""
        q, size = self.cfg.num_quantizers, self.cfg.codebook_size
        if codes.dim() != 3 or codes.shape[1] != q:
            raise ValueError(f"codec: codes must be [B, {q}, frames], got {tuple(codes.shape)}")
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"codec: codes must be an integer tensor, got {codes.dtype}")
        if codes.shape[-1] < 1:
            raise ValueError("codec: codes hold no frames")
        bad = (codes < 0) | (codes >= size)
        if bool(bad.any()):
            b, book, f = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"codec: codebook {book} has id {int(codes[b, book, f])} at frame {f}, outside [0, {size})"
            )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Raises ValueError as :meth:`check_codes`."""
        self.check_codes(codes)
        x = self.pre_conv(self.quantizer.decode(codes.long()))
        x = self.pre_transformer(x.transpose(1, 2)).transpose(1, 2)
        for pair in self.upsample:
            for layer in pair:
                x = layer(x)
        for layer in self.decoder:
            x = layer(x)
        return x.clamp(-1.0, 1.0)


def chunk_bounds(frames: int, first_chunk: int, chunk: int, left_context: int) -> list[tuple[int, int, int]]:
    """``(context_start, start, end)`` frame indices of each decode window of a chunked decode.

    Windows: ``[0, first_chunk)``, then ``chunk`` frames at a time; each is decoded together with up to
    ``left_context`` earlier frames, whose samples are dropped. Raises ValueError on sizes < 1 (< 0 for
    the context).
    """
    if first_chunk < 1 or chunk < 1 or left_context < 0:
        raise ValueError(
            f"chunk sizes must be >= 1 and context >= 0, got {first_chunk}, {chunk}, {left_context}"
        )
    out, start = [], 0
    while start < frames:
        end = min(start + (first_chunk if start == 0 else chunk), frames)
        out.append((max(0, start - left_context), start, end))
        start = end
    return out


@torch.no_grad()
def chunked_decode(
    decoder: CodecDecoder,
    codes: torch.Tensor,
    first_chunk: int = STREAM_FIRST_CHUNK,
    chunk: int = STREAM_CHUNK,
    left_context: int = STREAM_LEFT_CONTEXT,
) -> torch.Tensor:
    """Decode ``codes`` ``[B, Q, F]`` window by window (see :func:`chunk_bounds`) → ``[B, 1, F·hop]``.

    With ``first_chunk = chunk = 300, left_context = 25`` this is the reference's
    ``Qwen3TTSTokenizerV2Decoder.chunked_decode``; the defaults are the streaming schedule.
    """
    hop = decoder.total_upsample
    pieces = []
    for ctx, start, end in chunk_bounds(codes.shape[-1], first_chunk, chunk, left_context):
        pieces.append(decoder(codes[..., ctx:end])[..., (start - ctx) * hop :])
    return torch.cat(pieces, dim=-1)
