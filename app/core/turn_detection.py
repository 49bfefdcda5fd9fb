"""End-of-turn detection: has the user finished speaking, or only paused?

Two pieces, one job each:

* :class:`SmartTurnModel` — Smart Turn v3.2 (pipecat-ai, BSD-2), an audio classifier that reads the
  last 8 s of a user turn and gives the probability that the turn is complete. It hears intonation
  and syntax ("I would like to order a" is incomplete however long the pause after it).
* :class:`EndOfTurnPolicy` — pure decision, per input frame, from the trailing silence of the open
  speech segment and the model's verdict on this pause: keep listening, ask the model, or end the
  segment. No model, no clock, no I/O; the session runs the model off the event loop and feeds the
  verdict back.

Model card facts (pipecat ``audio/turn/smart_turn/local_smart_turn_v3.py`` and
``_whisper_features.py``, pipecat-ai 1.14.0; model ``smart-turn-v3.2-cpu.onnx``, int8-quantised):

* input ``input_features`` float32 ``[batch, 80, 800]``: Whisper log-mel features of exactly 8 s at
  16 kHz (128000 samples). Longer audio keeps its **last** 8 s; shorter audio is zero-padded at the
  **start** (so the end of the turn always sits at the end of the window);
* before the spectrogram the padded 8 s waveform is normalised to zero mean and unit variance
  (``(x − mean) / sqrt(var + 1e-7)``, padding included), as ``WhisperFeatureExtractor(do_normalize=True)``;
* features: 25 ms Hann window (400 samples), 10 ms hop (160 samples), 80 Slaney mel bins over 0–8000 Hz,
  ``log10`` clamped at ``max − 8``, ``(x + 4) / 4``; 800 frames (the last STFT frame is dropped);
* output ``logits`` float32 ``[batch, 1]``: despite its name, already a sigmoid probability in [0, 1]
  (pipecat reads it as the probability and calls the turn complete above 0.5).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from omniduplex.app.core.audio.pcm import SAMPLE_RATE
from omniduplex.app.core.vad import TurnConfig

log = logging.getLogger("omniduplex.turn_detection")

SMART_TURN_RATE = 16000
"""Smart Turn input rate (Hz)."""
SMART_TURN_WINDOW_S = 8
"""Smart Turn window (s): the model hears the last 8 s of the turn."""
SMART_TURN_SAMPLES = SMART_TURN_RATE * SMART_TURN_WINDOW_S
"""Samples in the window (128000)."""
SMART_TURN_MELS = 80
"""Mel bins of the features."""
SMART_TURN_FRAMES = 800
"""Feature frames in the window (10 ms each)."""
_NORM_EPS = 1e-7  # WhisperFeatureExtractor.zero_mean_unit_var_norm

assert SAMPLE_RATE == SMART_TURN_RATE  # the session's input rate is the model's: no resampling


class TurnModel(Protocol):
    """End-of-turn classifier: ``audio`` is the user's turn so far (float32 mono at 16 kHz, in [-1, 1],
    ending now); returns the probability in [0, 1] that the turn is complete. Called from a worker
    thread: it must be thread-safe and must not touch the session."""

    def probability(self, audio: np.ndarray) -> float: ...


def window(audio: np.ndarray) -> np.ndarray:
    """The model's 8 s window of ``audio`` (1-D, 16 kHz): its last 128000 samples, zero-padded at the
    start when shorter. Returns float32 ``[128000]``. Raises ValueError for non-1-D input."""
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"turn audio must be 1-D mono samples, got shape {x.shape}")
    if x.size >= SMART_TURN_SAMPLES:
        return x[-SMART_TURN_SAMPLES:]
    return np.concatenate([np.zeros(SMART_TURN_SAMPLES - x.size, np.float32), x])


class SmartTurnFeatures:
    """Waveform → Smart Turn input features ``[80, 800]`` (float32), with our Whisper log-mel front end
    (:class:`~omniduplex.models.mel.LogMelFrontEnd` at 80 bins computes the same recipe; checked
    against pipecat's feature code in ``tests/test_turn_detection.py``).

    The front end runs in float64, as the reference does: the int8-quantised model is sensitive near
    its decision boundary (feature noise of 1e-5 moved a borderline probability from 0.18 to 0.57), so
    the features should not differ from the reference more than necessary (float64: ≤ 4e-6; float32:
    ≤ 4e-5). It costs ~3 ms per call.
    """

    def __init__(self) -> None:
        from omniduplex.models.mel import LogMelConfig, LogMelFrontEnd

        # .double(): the window and filter bank become float64, so the float32 waveform is promoted
        # before the STFT and the power spectrum, mel projection and log run in float64.
        self.front_end = LogMelFrontEnd(LogMelConfig(feature_size=SMART_TURN_MELS)).double()

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """``audio``: 1-D float at 16 kHz, any length (see :func:`window`). Returns float32 ``[80, 800]``."""
        import torch

        x = window(audio)
        x = (x - x.mean()) / np.sqrt(x.var() + _NORM_EPS)
        with torch.inference_mode():
            feats, _ = self.front_end(torch.from_numpy(x)[None, :])
        out: np.ndarray = feats[0].numpy().astype(np.float32)
        return out


class SmartTurnModel:
    """Smart Turn v3.2 on onnxruntime (CPU), one call per end-of-turn check.

    Args:
        onnx_path: the ``.onnx`` file (default: the one inside ``pipecat-ai``, located and sha256-checked
            by :func:`omniduplex.models.weights.locate`).
        threads: onnxruntime intra-op threads (1: the model takes one core for tens of ms; sessions share
            one instance, and concurrent calls from several worker threads are safe).

    Raises:
        WeightsError: the packaged model is missing or corrupted.
    """

    def __init__(self, onnx_path: str | Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        if onnx_path is None:
            from omniduplex.models.weights import SMART_TURN_V3, locate

            onnx_path = locate(SMART_TURN_V3)
        so = ort.SessionOptions()
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(onnx_path), sess_options=so, providers=["CPUExecutionProvider"]
        )
        self.input_name = self.session.get_inputs()[0].name  # "input_features"
        self.features = SmartTurnFeatures()

    def probability(self, audio: np.ndarray) -> float:
        """Probability in [0, 1] that the turn ending with ``audio`` is complete.

        ``audio``: 1-D float32 mono at 16 kHz in [-1, 1], the user's turn so far (only its last 8 s
        count). Raises ValueError for non-1-D input.
        """
        feats = self.features(audio)[None]  # [1, 80, 800]
        (out,) = self.session.run(None, {self.input_name: feats})
        return float(out.reshape(-1)[0])


def load_turn_model(cfg: TurnConfig) -> TurnModel | None:
    """The model ``cfg.turn_detection`` needs: :class:`SmartTurnModel` for ``"smart"``, ``None`` for
    ``"silence"``. Load it once per process and share it between sessions.

    Raises:
        WeightsError: ``"smart"`` and the packaged model is missing or corrupted.
    """
    if cfg.turn_detection == "smart":
        return SmartTurnModel()
    return None


EndOfTurnAction = Literal["wait", "check", "end"]
"""``wait``: keep listening; ``check``: ask the model about this pause now; ``end``: close the segment
(the session commits it as a user turn unless it is noise or speech over a reply)."""


@dataclass(frozen=True)
class EndOfTurnPolicy:
    """When an open speech segment ends, from its trailing silence and the model's verdict (pure).

    ``"silence"``: end after ``endpoint_ms`` of trailing silence (plain endpointing).
    ``"smart"``: once the silence reaches ``check_ms``, ask the model (once per pause); end at once when
    its probability is ``≥ threshold``; otherwise wait through the pause (speech that resumes continues
    the same segment) and end only after ``max_silence_ms``. While the assistant is replying, speech
    that has not barged in is not a turn, so ``"smart"`` falls back to plain endpointing then (no model
    call); so does a segment with less than ``min_turn_ms`` of speech, which the session drops as noise
    anyway.

    All durations in milliseconds of input audio.
    """

    mode: Literal["silence", "smart"] = "silence"
    endpoint_ms: int = 500
    check_ms: int = 200
    max_silence_ms: int = 2000
    threshold: float = 0.5
    min_turn_ms: int = 200

    @classmethod
    def from_config(cls, cfg: TurnConfig) -> EndOfTurnPolicy:
        return cls(cfg.turn_detection, cfg.endpoint_ms, cfg.smart_check_ms, cfg.smart_max_silence_ms,
                   cfg.smart_threshold, cfg.min_turn_ms)

    @property
    def silence_limit_ms(self) -> int:
        """Trailing silence that ends a segment whatever the model says (the segmenter's endpoint)."""
        return self.max_silence_ms if self.mode == "smart" else self.endpoint_ms

    def decide(self, silence_ms: int, speech_ms: int, checked: bool = False, probability: float | None = None,
               replying: bool = False) -> EndOfTurnAction:
        """The action for the open segment after this frame.

        Args:
            silence_ms: trailing silence of the open segment (ms); 0 while speech goes on.
            speech_ms: voiced audio in the segment so far (ms).
            checked: the model has been asked about this pause (its verdict may still be pending).
            probability: the model's verdict on this pause, ``None`` until it is in.
            replying: the assistant's reply is pending or playing.
        """
        if silence_ms <= 0:
            return "wait"
        if self.mode == "silence" or replying or speech_ms < self.min_turn_ms:
            return "end" if silence_ms >= self.endpoint_ms else "wait"
        if silence_ms >= self.max_silence_ms:
            return "end"
        if probability is not None and probability >= self.threshold:
            return "end"
        if not checked and silence_ms >= self.check_ms:
            return "check"
        return "wait"
