"""The cascade's ASR: which model an ASR folder holds (:func:`load_asr`), and the names the rest of the code
imports from here: the transcript types (:mod:`.transcript`) and Whisper (:mod:`.whisper`)."""

from __future__ import annotations

from pathlib import Path

from omniduplex.models.cascade.moonshine import MoonshineASR, is_moonshine_dir
from omniduplex.models.cascade.transcript import SAMPLE_RATE, Transcript, Word
from omniduplex.models.cascade.whisper import WhisperASR

__all__ = ["SAMPLE_RATE", "MoonshineASR", "Transcript", "WhisperASR", "Word", "load_asr"]


def load_asr(model_dir: str | Path, cpu_threads: int = 1, language: str | None = "en"):
    """The transcriber of an ASR model folder: :class:`~.moonshine.MoonshineASR` for a Moonshine folder
    (``encoder_model``, ``decoder_model_merged``, ``tokenizer.bin``; English only), :class:`WhisperASR` for
    anything else (a CTranslate2 Whisper directory). Both have ``transcribe`` / ``transcribe_batch``.

    ``language``: what a multilingual Whisper is told the speech is (``None``: detect per utterance). The
    cascade is English (its system prompt and voices), so ``"en"`` by default: left to detect, Whisper base
    heard a fast en-gb espeak-ng question of ``bench asr`` as Thai.

    Raises:
        MoonshineError / RuntimeError / ValueError: the folder is neither model (the loader's error).
    """
    if is_moonshine_dir(model_dir):
        return MoonshineASR(model_dir, cpu_threads=cpu_threads)
    return WhisperASR(model_dir, cpu_threads=cpu_threads, language=language)
