"""Piper text-to-speech (VITS voices on onnxruntime) through the ``piper-tts`` package.

Piper (rhasspy/piper, OHF-Voice/piper1-gpl) turns text into espeak-ng phonemes and runs a VITS model
(Kim et al. 2021, "Conditional Variational Autoencoder with Adversarial Learning for End-to-End
Text-to-Speech") exported to ONNX; each voice has a ``.onnx.json`` config with its sample rate, phoneme
map and inference scales. ``PiperVoice.load`` builds the onnxruntime session with default options (all
cores); a stage process gets a fixed thread budget, so :class:`PiperTTS` builds its sessions itself, with
the graph split at its decoder (:mod:`~.piper_stream`) so a clause can be spoken in pieces.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from piper import PiperVoice
from piper.config import PiperConfig

from omniduplex.models.cascade.piper_stream import FIRST_PIECE_FRAMES, Piece, SplitVoice

log = logging.getLogger("omniduplex.tts")


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
        try:
            self.split: SplitVoice | None = SplitVoice(onnx.load(str(onnx_path)), opts)
            session = None  # the split parts run it; the whole graph is not loaded a second time
        except ValueError as e:  # not a Piper VITS export: whole utterances, no pieces
            log.warning("%s: %s; speaking whole sentences", onnx_path.name, e)
            self.split = None
            session = onnxruntime.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self.voice = PiperVoice(session=session, config=config)  # type: ignore[arg-type]
        self.scales = np.array([config.noise_scale, config.length_scale, config.noise_w_scale], np.float32)
        self.speaker_id = config.default_speaker_id if config.num_speakers > 1 else None

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
        parts = [p.pcm for p in self.stream(text, first_frames=None)]
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)

    def stream(self, text: str, first_frames: int | None = FIRST_PIECE_FRAMES) -> Iterator[Piece]:
        """Speak ``text`` in pieces (:class:`~.piper_stream.Piece`, float32 at :attr:`sample_rate`, in
        [-1, 1]); concatenated they are :meth:`synthesize`'s audio for the same noise. The first piece holds
        ``first_frames`` latent frames (``None``: whole sentences), made as soon as the first sentence's
        acoustic part and that much decoding are done (:mod:`~.piper_stream`). At least one piece: an
        empty, last one when there is nothing to pronounce."""
        sentences = [self._inputs(ph) for ph in self.voice.phonemize(text) if ph]
        if not sentences:
            yield Piece(np.zeros(0, np.float32), last=True)
            return
        if self.split is not None:
            pieces = self.split.pieces(sentences, first_frames)
        else:
            pieces = (
                Piece(self.voice.session.run(None, args)[0].reshape(-1), last=i == len(sentences) - 1)
                for i, args in enumerate(sentences)
            )
        for p in pieces:
            yield Piece(np.clip(p.pcm, -1.0, 1.0).astype(np.float32), p.last)

    def _inputs(self, phonemes: list[str]) -> dict[str, np.ndarray]:
        """The graph's inputs for one sentence (as ``PiperVoice.phoneme_ids_to_audio`` builds them)."""
        ids = np.array([self.voice.phonemes_to_ids(phonemes)], dtype=np.int64)
        args = {"input": ids, "input_lengths": np.array([ids.shape[1]], np.int64), "scales": self.scales}
        if self.speaker_id is not None:
            args["sid"] = np.array([self.speaker_id], np.int64)
        return args
