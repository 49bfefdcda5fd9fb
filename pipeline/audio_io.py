"""Reading user audio of any rate/channel count and writing the assistant's 24 kHz answer."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

MODEL_INPUT_RATE = 16_000
"""Sample rate of the audio encoder's log-mel front end (Whisper / Qwen3-Omni: 16 kHz)."""
OUTPUT_RATE = 24_000
"""Sample rate of Code2Wav's waveform (Qwen3-Omni model card: 24 kHz)."""


class AudioInputError(ValueError):
    """Audio that cannot be used: unreadable, empty, or silent-length."""


def load_audio(source: str | Path | bytes, target_rate: int = MODEL_INPUT_RATE) -> np.ndarray:
    """Decode WAV/FLAC/OGG (anything libsndfile reads), downmix to mono, resample (soxr HQ).

    Returns float32 ``[samples]`` in [-1, 1].

    Raises:
        AudioInputError: the file is missing, not audio, or has no samples.
    """
    try:
        data, rate = sf.read(
            io.BytesIO(source) if isinstance(source, bytes) else str(source), dtype="float32", always_2d=True
        )
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        name = "audio bytes" if isinstance(source, bytes) else str(source)
        raise AudioInputError(f"cannot read {name}: {e}") from e
    if data.shape[0] == 0:
        raise AudioInputError("audio has no samples")
    mono = data.mean(axis=1)
    if rate != target_rate:
        mono = soxr.resample(mono, rate, target_rate, quality="HQ").astype(np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32)


def write_wav(path: str | Path, samples: np.ndarray, rate: int = OUTPUT_RATE) -> None:
    """Write float samples ``[n]`` as 16-bit PCM mono WAV."""
    sf.write(str(path), np.clip(samples, -1.0, 1.0), rate, subtype="PCM_16")
