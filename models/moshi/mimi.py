"""Mimi, Kyutai's streaming neural audio codec (Moshi paper arXiv 2410.00037 §3.3; tensor names of
``moshi/models/compression.py``, ``modules/seanet.py``, ``quantization/vq.py``).

24 kHz mono → SEANet encoder (causal convs, ratios 4·5·6·8 = 960 → 25 Hz) → 8-layer transformer (context 250)
→ learnt stride-2 conv (``downsample``, replicate left pad) → 12.5 Hz latents → split RVQ (1 semantic codebook
in ``rvq_first``, acoustic ones in ``rvq_rest``, each behind a 1×1 conv projection) → codes. Decoding mirrors
it (``upsample`` is a channel-wise transposed conv, as published). Streaming one 80 ms frame (1920 samples)
at a time gives the same codes and waveform as one call over the whole signal.
"""

from __future__ import annotations

import torch
from torch import nn

from omniduplex.models.moshi.config import FRAME_SAMPLES
from omniduplex.models.moshi.streaming import StreamingConv1d, StreamingConvTranspose1d
from omniduplex.models.moshi.transformer import ProjectedTransformer


class ResnetBlock(nn.Module):
    """``x + conv1x1(elu(conv_k(elu(x))))`` with a ``dim // compress`` bottleneck (``block.1``,
    ``block.3``)."""

    def __init__(self, dim: int, kernel: int, dilation: int, compress: int) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(
            nn.ELU(),
            StreamingConv1d(dim, hidden, kernel, dilation=dilation),
            nn.ELU(),
            StreamingConv1d(hidden, dim, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class SEANet(nn.Module):
    """A SEANet stack under ``model.{i}`` (the published prefix)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def seanet_encoder(cfg: dict) -> SEANet:
    """SEANet encoder ``model.{i}``: ``[B, 1, T]`` → ``[B, dimension, T / 960]``."""
    nf, mult, layers = (
        cfg["n_filters"],
        1,
        [StreamingConv1d(cfg["channels"], cfg["n_filters"], cfg["kernel_size"])],
    )
    for ratio in reversed(cfg["ratios"]):
        for j in range(cfg["n_residual_layers"]):
            layers.append(
                ResnetBlock(
                    mult * nf, cfg["residual_kernel_size"], cfg["dilation_base"] ** j, cfg["compress"]
                )
            )
        layers += [nn.ELU(), StreamingConv1d(mult * nf, mult * nf * 2, ratio * 2, stride=ratio)]
        mult *= 2
    layers += [nn.ELU(), StreamingConv1d(mult * nf, cfg["dimension"], cfg["last_kernel_size"])]
    return SEANet(layers)


def seanet_decoder(cfg: dict) -> SEANet:
    """SEANet decoder ``model.{i}``: ``[B, dimension, T]`` → ``[B, 1, T · 960]``."""
    nf, mult = cfg["n_filters"], 2 ** len(cfg["ratios"])
    layers: list[nn.Module] = [StreamingConv1d(cfg["dimension"], mult * nf, cfg["kernel_size"])]
    for ratio in cfg["ratios"]:
        layers += [nn.ELU(), StreamingConvTranspose1d(mult * nf, mult * nf // 2, ratio * 2, ratio)]
        for j in range(cfg["n_residual_layers"]):
            layers.append(
                ResnetBlock(
                    mult * nf // 2, cfg["residual_kernel_size"], cfg["dilation_base"] ** j, cfg["compress"]
                )
            )
        mult //= 2
    layers += [nn.ELU(), StreamingConv1d(nf, cfg["channels"], cfg["last_kernel_size"])]
    return SEANet(layers)


class Codebook(nn.Module):
    """Euclidean codebook stored as EMA sums (``embedding_sum`` ``[bins, D]``, ``cluster_usage`` ``[bins]``):
    centroids are ``embedding_sum / max(cluster_usage, 1e-5)``; a vector's code is its nearest centroid
    (L2)."""

    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("_initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(bins))
        self.register_buffer("embedding_sum", torch.zeros(bins, dim))

    @property
    def centroids(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[N, D]`` → int64 ``[N]``."""
        return torch.cdist(x[None], self.centroids[None], p=2)[0].argmin(dim=-1)


class _VQ(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(bins, dim)


class _Layers(nn.Module):
    def __init__(self, n: int, bins: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQ(bins, dim) for _ in range(n)])


class RVQ(nn.Module):
    """Residual VQ behind 1×1 convs (``input_proj`` ``[Dq, D, 1]``, ``output_proj`` ``[D, Dq, 1]``)."""

    def __init__(self, n_q: int, bins: int, dim: int, d_in: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(d_in, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, d_in, 1, bias=False)
        self.vq = _Layers(n_q, bins, dim)

    def encode(self, x: torch.Tensor, n_q: int) -> torch.Tensor:
        """``x`` ``[B, D, T]`` → codes int64 ``[B, n_q, T]``."""
        r = self.input_proj(x).transpose(1, 2)
        b, t, d = r.shape
        r = r.reshape(b * t, d)
        codes = []
        for layer in self.vq.layers[:n_q]:
            c = layer._codebook.encode(r)
            r = r - nn.functional.embedding(c, layer._codebook.centroids)
            codes.append(c.view(b, t))
        return torch.stack(codes, 1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, K, T]`` → ``[B, D, T]``."""
        q = torch.zeros((), device=codes.device)
        for k in range(codes.shape[1]):
            q = q + nn.functional.embedding(codes[:, k], self.vq.layers[k]._codebook.centroids)
        return self.output_proj(q.transpose(1, 2))


class SplitRVQ(nn.Module):
    """Mimi's split RVQ: codebook 0 from ``rvq_first`` (semantic, distilled from WavLM), the rest from
    ``rvq_rest``; both read the same latent and their decodings are summed (§3.3, "Split RVQ")."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        dim, bins, d_in = cfg["dimension"], cfg["bins"], cfg["input_dimension"]
        self.rvq_first = RVQ(1, bins, dim, d_in)
        self.rvq_rest = RVQ(cfg["n_q"] - 1, bins, dim, d_in)

    def encode(self, x: torch.Tensor, n_q: int) -> torch.Tensor:
        return torch.cat([self.rvq_first.encode(x, 1), self.rvq_rest.encode(x, n_q - 1)], 1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        q = self.rvq_first.decode(codes[:, :1])
        if codes.shape[1] > 1:
            q = q + self.rvq_rest.decode(codes[:, 1:])
        return q


class _Resample(nn.Module):
    def __init__(self, dim: int, up: bool) -> None:
        super().__init__()
        if up:
            self.convtr = StreamingConvTranspose1d(dim, dim, 4, 2, groups=dim, bias=False)
        else:
            self.conv = StreamingConv1d(dim, dim, 4, 2, bias=False, pad_mode="replicate")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convtr(x) if hasattr(self, "convtr") else self.conv(x)


class Mimi(nn.Module):
    """The codec. ``encode``: float ``[B, 1, N]`` in [-1, 1] at 24 kHz → int64 ``[B, K, N / 1920]``;
    ``decode``: codes ``[B, K, T]`` → ``[B, 1, T · 1920]``. Under :func:`~.streaming.start_streaming`, ``N``
    must be a multiple of 1920 (raises ValueError otherwise); one-shot calls zero-pad the end to one."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_codebooks = cfg.get("num_codebooks", 8)
        self.encoder = seanet_encoder(cfg["seanet"])
        self.decoder = seanet_decoder(cfg["seanet"])
        self.encoder_transformer = ProjectedTransformer(cfg["transformer"])
        self.decoder_transformer = ProjectedTransformer(cfg["transformer"])
        self.quantizer = SplitRVQ(cfg["quantizer"])
        dim = cfg["seanet"]["dimension"]
        self.downsample = _Resample(dim, up=False)
        self.upsample = _Resample(dim, up=True)

    def encode(self, pcm: torch.Tensor) -> torch.Tensor:
        n = pcm.shape[-1]
        if self.encoder.model[0].state is not None:
            if n == 0 or n % FRAME_SAMPLES:
                raise ValueError(
                    f"streaming Mimi needs a positive multiple of {FRAME_SAMPLES} samples, got {n}"
                )
        elif n % FRAME_SAMPLES:
            pcm = nn.functional.pad(pcm, (0, FRAME_SAMPLES - n % FRAME_SAMPLES))
        emb = self.downsample(self.encoder_transformer(self.encoder(pcm)))
        return self.quantizer.encode(emb, self.num_codebooks)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        emb = self.upsample(self.quantizer.decode(codes))
        return self.decoder(self.decoder_transformer(emb))
