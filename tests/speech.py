"""Shared helpers for tests that speak and listen: speech from espeak-ng + sox, and word error rate."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from omniduplex.benchmarks.wer import edit_distance, wer, words_of  # noqa: F401 (re-exported for tests)
from omniduplex.pipeline.audio_io import load_audio


def espeak(tmp_path: Path, name: str, text: str, rate: int = 16000) -> np.ndarray:
    """``text`` spoken by espeak-ng (Debian package, installed by scripts/install.sh), converted by sox to
    mono 16-bit at ``rate`` Hz without dither (``-D``: the same samples every run); float32 ``[samples]``."""
    raw, wav = tmp_path / f"{name}-raw.wav", tmp_path / f"{name}.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True)
    subprocess.run(["sox", "-D", str(raw), "-r", str(rate), "-c", "1", "-b", "16", str(wav)], check=True)
    return load_audio(wav, rate)


