"""Synthetic dialogs and Full-Duplex-Bench-style measures (Lin et al. 2025, "Full-Duplex-Bench", arXiv
2503.04721: pause handling, backchannelling, smooth turn-taking, user interruption) for ``bench duplex``.

A dialog is a per-frame script of user activity (80 ms frames): turns of voiced "speech" (a harmonic tone with
a syllable-rate amplitude envelope plus noise, 0.6–2.4 s), pauses between turns (0.8–2.0 s), and barge-ins
(a user turn that starts while the model is expected to be speaking: right after its response onset window).
The model's activity per frame is an energy VAD on its output (RMS above ``SPEAKING_RMS``). Measures:

* turn-over rate: user turn ends after which the model starts speaking within ``TAKE_TURN_S``;
* response latency: user stop → the model's first speaking frame, over those turns (ms);
* stop-when-interrupted rate: barge-ins during model speech after which the model falls silent within
  ``STOP_S`` and stays silent for ``STOP_HOLD_S`` (or the rest of the user's turn if shorter), so one quiet
  frame inside continued speech does not count; stop latency: barge-in onset → that silence (ms);
* backchannel rate: short model bursts (< 1 s) that start and end inside a user turn, per minute of user
  speech.

On random weights these numbers are mechanical (the model never learnt to listen): they show the harness works
and what a trained checkpoint would be measured with, not conversational quality.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_S = 0.08
SAMPLES = 1920
SPEAKING_RMS = 0.02
"""Output RMS above which a model frame counts as speech (−34 dBFS)."""
TAKE_TURN_S = 1.5
"""A user turn's end counts as taken over when the model speaks within this time (s)."""
STOP_S = 1.0
"""The model must fall silent within this time after a barge-in (s)."""
STOP_HOLD_S = 0.4
"""... and stay silent this long (s), or until the user's turn ends if that comes first."""


@dataclass
class Dialog:
    """``user_active`` bool ``[frames]`` and ``audio`` float32 ``[frames, 1920]`` (24 kHz)."""

    user_active: np.ndarray
    audio: np.ndarray


def make_dialog(seed: int, seconds: float) -> Dialog:
    """A seeded random dialog of ``seconds`` of user turns and pauses (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n = int(seconds / FRAME_S)
    active = np.zeros(n, dtype=bool)
    t = int(rng.uniform(0.3, 1.0) / FRAME_S)
    while t < n:
        length = int(rng.uniform(0.6, 2.4) / FRAME_S)
        active[t : t + length] = True
        t += length + int(rng.uniform(0.8, 2.0) / FRAME_S)
    audio = np.zeros((n, SAMPLES), dtype=np.float32)
    time_s = np.arange(SAMPLES) / 24000.0
    f0 = rng.uniform(110, 220)
    for i in np.nonzero(active)[0]:
        tt = time_s + i * FRAME_S
        env = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * tt)  # ~4 syllables/s
        voiced = sum(np.sin(2 * np.pi * f0 * h * tt) / h for h in (1, 2, 3))
        audio[i] = (0.25 * env * voiced + 0.02 * rng.standard_normal(SAMPLES)).astype(np.float32)
    return Dialog(active, audio)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` frame ranges (end exclusive) of the True runs."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.nonzero(edges == 1)[0].tolist(), np.nonzero(edges == -1)[0].tolist()))


def measures(user: np.ndarray, model_rms: np.ndarray) -> dict[str, float | None]:
    """Full-Duplex-Bench-style measures of one dialog: ``user`` bool ``[frames]`` (80 ms frames),
    ``model_rms`` float ``[frames]`` (the model's output RMS per frame). Rates are in [0, 1]; latencies in
    ms (``None`` when nothing to average). Raises ValueError when the two arrays are not 1-D of one length."""
    user, model_rms = np.asarray(user, dtype=bool), np.asarray(model_rms, dtype=float)
    if user.shape != model_rms.shape or user.ndim != 1:
        raise ValueError(f"user {user.shape} and model_rms {model_rms.shape} must be equal 1-D frame arrays")
    speaking = model_rms > SPEAKING_RMS
    turns = _runs(user)
    took, latencies, barge, stopped, stop_lat = 0, [], 0, 0, []
    for start, end in turns:
        window = speaking[end : end + int(TAKE_TURN_S / FRAME_S)]
        if window.any():
            took += 1
            latencies.append(float(np.argmax(window)) * FRAME_S * 1000)
        if start > 0 and speaking[start - 1]:  # the user barged in on model speech
            barge += 1
            hold = max(1, min(round(STOP_HOLD_S / FRAME_S), end - start))
            for t in range(start, min(start + round(STOP_S / FRAME_S), len(speaking))):
                if t + hold <= len(speaking) and not speaking[t : t + hold].any():
                    stopped += 1
                    stop_lat.append((t - start) * FRAME_S * 1000)
                    break
    backchannels = sum(
        1 for s, e in _runs(speaking) if e - s < 1 / FRAME_S and user[s:e].all() and s > 0 and user[s - 1]
    )
    user_minutes = user.sum() * FRAME_S / 60
    return {
        "turn_over_rate": took / len(turns) if turns else None,
        "response_latency_ms": float(np.mean(latencies)) if latencies else None,
        "stop_when_interrupted_rate": stopped / barge if barge else None,
        "stop_latency_ms": float(np.mean(stop_lat)) if stop_lat else None,
        "backchannels_per_min": backchannels / user_minutes if user_minutes else None,
        "user_turns": len(turns),
        "barge_ins": barge,
    }
