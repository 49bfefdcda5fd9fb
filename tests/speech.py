"""Shared helpers for tests that speak and listen: speech from espeak-ng + sox, and word error rate."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

from omniduplex.pipeline.audio_io import load_audio


def espeak(tmp_path: Path, name: str, text: str, rate: int = 16000) -> np.ndarray:
    """``text`` spoken by espeak-ng (Debian package, installed by scripts/install.sh), converted by sox to
    mono 16-bit at ``rate`` Hz without dither (``-D``: the same samples every run); float32 ``[samples]``."""
    raw, wav = tmp_path / f"{name}-raw.wav", tmp_path / f"{name}.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True)
    subprocess.run(["sox", "-D", str(raw), "-r", str(rate), "-c", "1", "-b", "16", str(wav)], check=True)
    return load_audio(wav, rate)


def words_of(text: str) -> list[str]:
    """Lower-case words, punctuation dropped."""
    return re.findall(r"[a-z0-9']+", text.lower())


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level Levenshtein distance / reference length (case and punctuation ignored)."""
    ref, hyp = words_of(reference), words_of(hypothesis)
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[len(hyp)] / max(1, len(ref))
