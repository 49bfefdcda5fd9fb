"""The speaker encoder of Qwen3-TTS Base: ECAPA-TDNN (Desplanques et al. 2020, arXiv:2005.07143) over
a log-mel spectrogram of 24 kHz audio → one x-vector (``enc_dim``, 1024 published) that stands in for
a speaker id in the talker prompt.

Tensor names follow ``speaker_encoder.*`` of ``Qwen3TTSForConditionalGeneration`` (qwen-tts 0.1.1):
``blocks.0`` (TDNN), ``blocks.1..3`` (SE-Res2Net), ``mfa``, ``asp`` (attentive statistics pooling), ``fc``.
Every conv is ``padding="same"`` with reflect padding, as the reference's.

Front end (``extract_speaker_embedding`` / ``mel_spectrogram`` of the reference): reflect-pad
``(n_fft − hop) / 2`` samples on both sides, STFT (n_fft 1024, hop 256, periodic Hann window of
1024, not centred), magnitude ``sqrt(re² + im² + 1e-9)``, Slaney mel filter bank (librosa
``filters.mel``: 128 bins, 0–12 kHz), natural log of ``max(mel, 1e-5)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.mel import mel_filter_bank
from omniduplex.models.qwen3_tts.config import SpeakerEncoderConfig

N_FFT, HOP, WIN, F_MIN, F_MAX = 1024, 256, 1024, 0.0, 12000.0
MIN_SAMPLES = N_FFT
"""Shortest reference clip (samples) the front end accepts: one STFT window."""


def speaker_mel(wav: torch.Tensor, n_mels: int = 128, sample_rate: int = 24000) -> torch.Tensor:
    """Mono float waveform ``[S]`` in [-1, 1] at ``sample_rate`` → log-mel ``[frames, n_mels]`` fp32,
    ``frames = (S + 2·384 − 1024) // 256 + 1``.

    Raises ValueError for a non-1-D input or fewer than :data:`MIN_SAMPLES` samples.
    """
    if wav.dim() != 1:
        raise ValueError(f"speaker encoder: expected a mono waveform [samples], got {tuple(wav.shape)}")
    if wav.shape[0] < MIN_SAMPLES:
        raise ValueError(
            f"speaker encoder: reference clip has {wav.shape[0]} samples, needs >= {MIN_SAMPLES} "
            f"({MIN_SAMPLES / sample_rate * 1000:.0f} ms at {sample_rate} Hz)"
        )
    pad = (N_FFT - HOP) // 2
    y = F.pad(wav.float()[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(
        y,
        N_FFT,
        hop_length=HOP,
        win_length=WIN,
        window=torch.hann_window(WIN, device=wav.device),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)  # [1, bins, frames]
    basis = mel_filter_bank(N_FFT, n_mels, sample_rate, F_MIN, F_MAX).T.float().to(wav.device)
    return torch.log(torch.clamp(torch.matmul(basis, mag), min=1e-5))[0].T


def _conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """``relu(conv(x))`` on ``[B, C, T]`` (same-length, reflect-padded)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """Res2Net (Gao et al. 2019): channel split in ``scale`` parts, part ``i ≥ 1`` through a TDNN after
    adding the previous part's output (part 1 alone), part 0 passed through."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        w = channels // scale
        self.blocks = nn.ModuleList(TDNN(w, w, kernel, dilation) for _ in range(scale - 1))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        prev = None
        for i, block in enumerate(self.blocks, start=1):
            prev = block(parts[i] if prev is None else parts[i] + prev)
            out.append(prev)
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    """SE (Hu et al. 2018): ``x · sigmoid(conv2(relu(conv1(mean_t x))))``."""

    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.conv2 = _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=2, keepdim=True)
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(s))))


class SERes2NetBlock(nn.Module):
    """TDNN(1×1) → Res2Net → TDNN(1×1) → SE, plus the input."""

    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = TDNN(cout, cout, 1, 1)
        self.se_block = SqueezeExcitation(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _weighted_stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of ``x`` ``[B, C, T]`` under weights ``w`` (summing to 1 over T); std floored at 1e-6."""
    mean = (w * x).sum(2)
    std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class AttentiveStatsPool(nn.Module):
    """Attentive statistics pooling (Okabe et al. 2018) with global context: ``[B, C, T] → [B, 2C, 1]``."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, t), 1.0 / t, dtype=x.dtype, device=x.device)
        mean, std = _weighted_stats(x, uniform)
        ctx = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        attn = F.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
        mean, std = _weighted_stats(x, attn)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """Log-mel ``[B, frames, mel_dim]`` → x-vector ``[B, enc_dim]``."""

    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.blocks = nn.ModuleList([TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(
                SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
            )
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.no_grad()
    def embed(self, wav: torch.Tensor) -> torch.Tensor:
        """Mono 24 kHz waveform ``[S]`` (any device) → x-vector ``[enc_dim]`` (weight dtype and device).

        Raises ValueError as :func:`speaker_mel`."""
        w = next(self.parameters())
        mel = speaker_mel(wav.to(w.device), self.cfg.mel_dim, self.cfg.sample_rate)
        return self(mel[None].to(w.dtype))[0]
