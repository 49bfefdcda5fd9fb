"""PCM conventions shared by every surface: the session's frame, and THE int16 ↔ float conversion.

int16 ↔ float uses the two's-complement fixed-point (Q15) scale of 2**15 = 32768, the convention of
torchaudio (``torchaudio.load(normalize=True)`` divides 16-bit PCM by 2**15) and of libsndfile's reads:

* int16 → float: ``x / 32768`` — exact, in [-1, 1 - 2**-15].
* float → int16: ``clip(rint(x * 32768), -32768, 32767)`` — round to nearest, then clip; so
  int16 → float → int16 is the identity, and float → int16 → float is off by at most 2**-16 inside
  [-1, 1). Values past full scale clip (``1.0`` → 32767, ``-1.0`` → -32768).
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
"""Session input rate (Hz): what VAD, end-of-turn and ASR take."""
FRAME_MS = 20
"""Frame period of every surface, both ways (ms): Twilio media messages, RTP ptime, Opus frames."""
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000
"""Samples in one session input frame (320 at 16 kHz)."""
Q15 = 32768.0
"""int16 full scale (2**15)."""


def frame_samples(rate: int) -> int:
    """Samples in one :data:`FRAME_MS` frame at ``rate`` Hz (160 at 8 kHz, 480 at 24 kHz, 960 at 48 kHz)."""
    return rate * FRAME_MS // 1000


def to_float32(pcm: np.ndarray) -> np.ndarray:
    """Samples as 1-D float32 in [-1, 1): int16 is divided by 32768; float passes through as float32."""
    pcm = np.asarray(pcm).reshape(-1)
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / np.float32(Q15)
    return pcm.astype(np.float32, copy=False)


def to_int16(x: np.ndarray) -> np.ndarray:
    """Samples as 1-D int16: float is scaled by 32768, rounded and clipped; int16 passes through."""
    x = np.asarray(x).reshape(-1)
    if x.dtype == np.int16:
        return x
    return np.clip(np.rint(np.asarray(x, np.float64) * Q15), -32768, 32767).astype(np.int16)


def mono(pcm: np.ndarray, channels: int) -> np.ndarray:
    """Interleaved samples of ``channels`` channels → 1-D float32 mono (the channels' mean).

    Raises:
        ValueError: ``channels`` < 1, or the sample count is not a multiple of it.
    """
    x = to_float32(pcm)
    if channels < 1 or x.size % channels:
        raise ValueError(f"{x.size} interleaved samples do not split into {channels} channel(s)")
    return x if channels == 1 else x.reshape(-1, channels).mean(axis=1)
