"""Which speech and transcription services a server runs (:mod:`.contract`), loaded on first use."""

from __future__ import annotations

from functools import lru_cache

from omniduplex.app.host.speech.contract import SpeechService, Transcriber


def qwen3_tts_dir(cfg) -> str | None:
    """The Qwen3-TTS checkpoint of the speech endpoint for a host config ``cfg``: ``cfg.tts``, else the TTS of
    a cascade manifest ``cfg.model`` when that is a Qwen3-TTS checkpoint (the assistant's voice), else
    ``None`` (Piper)."""
    if cfg.tts:
        return cfg.tts
    from omniduplex.models.cascade.manifest import is_cascade, load_manifest

    if cfg.model and is_cascade(cfg.model):
        m = load_manifest(cfg.model)
        return str(m.tts) if m.tts_is_qwen3 else None
    return None


def load_speech(cfg) -> SpeechService:
    """The speech service of a host config ``cfg`` (blocking: loads weights): Qwen3-TTS for
    :func:`qwen3_tts_dir` (on its graph with ``cfg.tts_graph``), else the packaged Piper voice.

    Raises:
        WeightsError / CheckpointError / ConfigError: the weights do not load.
    """
    tts_dir = qwen3_tts_dir(cfg)
    if tts_dir is None:
        from omniduplex.app.host.speech.piper import packaged_piper

        return packaged_piper()
    if cfg.tts_graph:
        from omniduplex.app.host.speech.qwen3_graph import Qwen3GraphSpeech

        return Qwen3GraphSpeech(tts_dir)
    from omniduplex.app.host.speech.qwen3 import Qwen3Speech

    return Qwen3Speech(tts_dir)


@lru_cache(maxsize=1)
def packaged_whisper() -> Transcriber:
    """The packaged Whisper tiny.en (``models/weights.py``), loaded once per process.

    Raises:
        WeightsError: its package is missing or corrupted.
    """
    from omniduplex.models.cascade.whisper import WhisperASR
    from omniduplex.models.weights import WHISPER_TINY_EN, locate

    return WhisperASR(locate(WHISPER_TINY_EN).parent)
