"""Whisper-style log-mel front end for the Qwen3-Omni audio encoder, batched in torch.

Qwen3-Omni's processor runs ``WhisperFeatureExtractor(feature_size=128, sampling_rate=16000,
hop_length=160, n_fft=400, dither=0.0)`` with ``padding=True, truncation=False,
return_attention_mask=True`` (``processing_qwen3_omni_moe.py``; model card
Qwen/Qwen3-Omni-30B-A3B-Instruct ``preprocessor_config.json``). The recipe is Whisper's
``log_mel_spectrogram`` (openai/whisper ``audio.py``):

1. STFT, periodic Hann window of ``n_fft`` samples, hop ``hop_length``, centred (reflect-padded
   by ``n_fft // 2`` on both sides), power spectrum ``|X|²``;
2. the last STFT frame is dropped, so an utterance of ``S`` samples gives ``S // hop_length`` frames;
3. Slaney-normalised mel filter bank on the Slaney mel scale, 0–8000 Hz;
4. ``log10(max(mel, 1e-10))``, clamped from below at ``max − 8`` where the max is taken over the
   whole utterance (all bins, all frames), then ``(x + 4) / 4``.

Every utterance is computed exactly as the reference computes it when called on that utterance
alone: reflect padding at its own end and its own max. Batching never changes an utterance's
features. (The reference itself, when handed a list, zero-pads all waveforms to the longest
before the STFT, which alters the last frames of the shorter ones and gives them
``ceil(S / hop)`` frames instead of ``S // hop``; we do not reproduce that.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Whisper's filter bank spans 0–8000 Hz whatever the sampling rate (feature_extraction_whisper.py).
MEL_MIN_HZ = 0.0
MEL_MAX_HZ = 8000.0
# Whisper log_mel_spectrogram constants: power floor, dynamic range (log10 units), affine rescale.
LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0


def hz_to_mel_slaney(hz: torch.Tensor) -> torch.Tensor:
    """Hz → mel on Slaney's scale (Auditory Toolbox, 1998): linear ``3f/200`` below 1 kHz, log above.

    ``hz``: float tensor of any shape, in Hz. Returns mels, same shape and dtype.
    """
    lin = 3.0 * hz / 200.0
    log = 15.0 + torch.log(torch.clamp(hz, min=1e-12) / 1000.0) * (27.0 / math.log(6.4))
    return torch.where(hz >= 1000.0, log, lin)


def mel_to_hz_slaney(mel: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`hz_to_mel_slaney`. ``mel``: float tensor; returns Hz, same shape and dtype."""
    lin = 200.0 * mel / 3.0
    log = 1000.0 * torch.exp((mel - 15.0) * (math.log(6.4) / 27.0))
    return torch.where(mel >= 15.0, log, lin)


def mel_filter_bank(
    n_fft: int, n_mels: int, sampling_rate: int, f_min: float = MEL_MIN_HZ, f_max: float = MEL_MAX_HZ
) -> torch.Tensor:
    """Slaney-style triangular mel filters with area ("slaney") normalisation, as librosa's ``filters.mel``.

    ``n_mels + 2`` edge frequencies are spaced evenly on the Slaney mel scale between ``f_min`` and
    ``f_max`` (Hz); filter ``m`` rises linearly from edge ``m`` to ``m+1`` and falls to ``m+2``, and is
    scaled by ``2 / (f[m+2] − f[m])`` so every filter has unit area.

    Returns float64 ``[n_fft // 2 + 1, n_mels]`` (rows: rFFT bins at ``k · sr / n_fft`` Hz).
    Raises ValueError if ``n_mels < 1`` or ``f_max <= f_min``.
    """
    if n_mels < 1 or f_max <= f_min:
        raise ValueError(
            f"need n_mels >= 1 and f_max > f_min, got n_mels={n_mels}, f_min={f_min}, f_max={f_max}"
        )
    n_bins = n_fft // 2 + 1
    fft_hz = torch.linspace(0.0, sampling_rate / 2, n_bins, dtype=torch.float64)
    mel_edges = torch.linspace(
        float(hz_to_mel_slaney(torch.tensor(f_min, dtype=torch.float64))),
        float(hz_to_mel_slaney(torch.tensor(f_max, dtype=torch.float64))),
        n_mels + 2,
        dtype=torch.float64,
    )
    edges_hz = mel_to_hz_slaney(mel_edges)  # [n_mels + 2]
    widths = edges_hz[1:] - edges_hz[:-1]  # [n_mels + 1]
    offsets = edges_hz[None, :] - fft_hz[:, None]  # [n_bins, n_mels + 2]
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    filters = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return filters * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[None, :]


@dataclass
class LogMelConfig:
    """The ``preprocessor_config.json`` keys of a ``WhisperFeatureExtractor`` that shape the features.

    Defaults are Qwen3-Omni's (128 mel bins, 16 kHz, 10 ms hop, 25 ms window). Other keys of the
    published file (``chunk_length``, ``n_samples``, ``padding_value``, ``return_attention_mask``, ...)
    only govern the reference's padding policy and are ignored.
    """

    feature_size: int = 128
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    dither: float = 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LogMelConfig:
        """Read a ``preprocessor_config.json`` dict; unknown keys are ignored, missing keys take defaults.

        Raises ValueError if ``dither`` is non-zero (random features cannot be batch-invariant).
        """
        names = {"feature_size", "sampling_rate", "hop_length", "n_fft", "dither"}
        cfg = cls(**{k: v for k, v in d.items() if k in names and v is not None})
        if cfg.dither != 0.0:
            raise ValueError(f"dither={cfg.dither} is not supported; Qwen3-Omni uses dither=0.0")
        return cfg


class LogMelFrontEnd(nn.Module):
    """Waveforms at ``sampling_rate`` Hz → Whisper log-mel features, one utterance at a time semantics.

    Holds no parameters (the window and filter bank are non-persistent buffers), so it adds nothing
    to a checkpoint's ``state_dict``.
    """

    def __init__(self, config: LogMelConfig | dict[str, Any] | None = None) -> None:
        super().__init__()
        if config is None:
            config = LogMelConfig()
        elif isinstance(config, dict):
            config = LogMelConfig.from_dict(config)
        self.config = config
        self.n_fft, self.hop_length, self.n_mels = config.n_fft, config.hop_length, config.feature_size
        window = torch.hann_window(config.n_fft, periodic=True, dtype=torch.float64)
        self.register_buffer("window", window.float(), persistent=False)
        filters = mel_filter_bank(config.n_fft, config.feature_size, config.sampling_rate)
        self.register_buffer("mel_filters", filters.float(), persistent=False)

    @property
    def min_samples(self) -> int:
        """Shortest accepted utterance, in samples: reflect padding needs more than ``n_fft // 2``."""
        return self.n_fft // 2 + 1

    def frame_count(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Feature frames for utterances of ``num_samples`` samples (int64 tensor): ``S // hop_length``."""
        return torch.div(num_samples, self.hop_length, rounding_mode="floor")

    def forward(
        self, waveforms: Sequence[torch.Tensor] | torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute log-mel features for a batch of utterances.

        ``waveforms``: a list of 1-D float tensors (samples at ``sampling_rate`` Hz, nominal range
        [-1, 1]), or a right-padded float tensor ``[B, S]`` with ``lengths`` int64 ``[B]`` (samples;
        default: all ``S``).

        Returns ``(features, feature_lens)``: ``features`` float32 ``[B, n_mels, F]`` with
        ``F = max(feature_lens)``, frames past an utterance's length set to 0; ``feature_lens`` int64
        ``[B]`` with ``feature_lens[b] = lengths[b] // hop_length`` (10 ms frames at the defaults).

        Raises ValueError for an empty batch, a non-1-D waveform, a shape/length mismatch, or an
        utterance shorter than :attr:`min_samples`.
        """
        audio, lengths = self._pad(waveforms, lengths)
        if int(lengths.min()) < self.min_samples:
            raise ValueError(
                f"every utterance needs at least {self.min_samples} samples (n_fft // 2 + 1), "
                f"got lengths {lengths.tolist()}"
            )
        half = self.n_fft // 2
        n_frames = self.frame_count(lengths)  # [B]
        max_frames = int(n_frames.max())
        # Reflect-pad each utterance at its own ends (torch.stft center=True, pad_mode="reflect").
        span = (max_frames - 1) * self.hop_length + self.n_fft
        pos = torch.arange(span, device=audio.device)[None, :] - half  # [1, span]
        last = (lengths - 1)[:, None]  # [B, 1]
        src = torch.where(pos < 0, -pos, pos)
        src = torch.where(src > last, 2 * last - src, src).clamp(min=0)
        padded = torch.gather(audio, 1, src)  # [B, span]
        frames = padded.unfold(1, self.n_fft, self.hop_length)[:, :max_frames]  # [B, F, n_fft]
        power = torch.fft.rfft(frames * self.window, dim=-1).abs().pow(2)  # [B, F, n_fft//2 + 1]
        mel = power @ self.mel_filters  # [B, F, n_mels]
        log_mel = torch.clamp(mel, min=LOG_FLOOR).log10()
        valid = torch.arange(max_frames, device=audio.device)[None, :] < n_frames[:, None]  # [B, F]
        peak = log_mel.masked_fill(~valid[:, :, None], float("-inf")).amax(dim=(1, 2), keepdim=True)
        log_mel = (torch.maximum(log_mel, peak - DYNAMIC_RANGE) + 4.0) / 4.0
        log_mel = log_mel.masked_fill(~valid[:, :, None], 0.0)
        return log_mel.transpose(1, 2).contiguous(), n_frames

    @staticmethod
    def _pad(
        waveforms: Sequence[torch.Tensor] | torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalise the two input forms to float32 ``[B, S]`` + int64 ``[B]`` lengths."""
        if isinstance(waveforms, torch.Tensor):
            if waveforms.dim() != 2:
                raise ValueError(
                    f"a padded waveform batch must be [B, S], got shape {tuple(waveforms.shape)}"
                )
            audio = waveforms.float()
            if lengths is None:
                lengths = torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long, device=audio.device)
            lengths = torch.as_tensor(lengths, dtype=torch.long, device=audio.device)
            if lengths.shape != (audio.shape[0],) or int(lengths.max()) > audio.shape[1]:
                raise ValueError(
                    f"lengths {lengths.tolist()} do not fit a batch of shape {tuple(audio.shape)}"
                )
        else:
            if len(waveforms) == 0:
                raise ValueError("empty batch of waveforms")
            for i, w in enumerate(waveforms):
                if w.dim() != 1:
                    raise ValueError(f"waveform {i} must be 1-D (mono samples), got shape {tuple(w.shape)}")
            lengths = torch.tensor(
                [w.shape[0] for w in waveforms], dtype=torch.long, device=waveforms[0].device
            )
            audio = nn.utils.rnn.pad_sequence([w.float() for w in waveforms], batch_first=True)
        if audio.shape[0] == 0:
            raise ValueError("empty batch of waveforms")
        return audio, lengths
