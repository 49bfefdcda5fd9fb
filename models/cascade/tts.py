"""Piper text-to-speech (VITS voices on onnxruntime) through the ``piper-tts`` package.

Piper (rhasspy/piper, OHF-Voice/piper1-gpl) turns text into espeak-ng phonemes and runs a VITS model
(Kim et al. 2021, "Conditional Variational Autoencoder with Adversarial Learning for End-to-End
Text-to-Speech") exported to ONNX; each voice has a ``.onnx.json`` config with its sample rate, phoneme
map and inference scales. ``PiperVoice.load`` builds the onnxruntime session with default options (all
cores); a stage process gets a fixed thread budget, so :class:`PiperTTS` builds the session itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
from piper import PiperVoice, SynthesisConfig
from piper.config import PiperConfig


class PiperTTS:
    """One Piper voice.

    Args:
        onnx_path: the voice's ``.onnx`` model.
        config_path: its ``.onnx.json`` (default: ``<onnx_path>.json``).
        threads: onnxruntime intra-op threads (inter-op 1, sequential execution).

    The speaking rate (``length_scale``) and the noise scales (``noise_scale``, ``noise_w``) come from the
    voice config's ``inference`` section. Audio is not peak-normalised per call (Piper's default): the
    cascade speaks one clause per call, and per-clause normalisation would make loudness jump between
    clauses.

    Raises:
        OSError / ValueError / KeyError: a missing or malformed config; onnxruntime's errors for a bad model.
    """

    def __init__(
        self, onnx_path: str | Path, config_path: str | Path | None = None, threads: int = 1
    ) -> None:
        onnx_path = Path(onnx_path)
        config_path = Path(config_path) if config_path else onnx_path.with_name(onnx_path.name + ".json")
        self.raw_config = json.loads(config_path.read_text(encoding="utf-8"))
        config = PiperConfig.from_dict(self.raw_config)
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        session = onnxruntime.InferenceSession(
            str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self.voice = PiperVoice(session=session, config=config)
        self.syn_config = SynthesisConfig(
            length_scale=config.length_scale,
            noise_scale=config.noise_scale,
            noise_w_scale=config.noise_w_scale,
            normalize_audio=False,
        )

    @property
    def sample_rate(self) -> int:
        """The voice's output rate (Hz; 22050 for ``medium`` voices)."""
        return int(self.voice.config.sample_rate)

    @property
    def voices(self) -> list[str]:
        """Speaker names: the ``speaker_id_map`` keys of a multi-speaker voice, else the voice's dataset
        name (e.g. ``["joe"]``)."""
        speakers = list(self.voice.config.speaker_id_map)
        return speakers or [str(self.raw_config.get("dataset") or "default")]

    def synthesize(self, text: str) -> np.ndarray:
        """Speak ``text``: float32 mono ``[samples]`` at :attr:`sample_rate`, in [-1, 1].

        Piper synthesises each sentence espeak-ng finds in ``text`` separately; they are concatenated.
        Text with nothing to pronounce (punctuation only, "") gives ``[0]`` samples.
        """
        parts = [c.audio_float_array for c in self.voice.synthesize(text, syn_config=self.syn_config)]
        if not parts:
            return np.zeros(0, dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)
