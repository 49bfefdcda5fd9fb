"""The packaged Piper voice behind the speech contract (:class:`~.contract.SpeechService`): the text cut into
clauses (the cascade's :class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`), each spoken in a
worker thread
in pieces (the voice split at its decoder, :mod:`omniduplex.models.cascade.piper_stream`: the first ~0.3 s
of a clause comes after one short decode) and resampled as one stream to 24 kHz. Piper has one voice:
``voice``, ``instructions``, ``language`` and the reference clip are accepted and ignored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import lru_cache
from pathlib import Path

import numpy as np
import soxr

from omniduplex.app.host.speech.contract import SPEECH_RATE, SpeechParams, SpeechService
from omniduplex.models.cascade.tts import PiperTTS
from omniduplex.pipeline.text.clauses import ClauseSplitter


class PiperSpeech(SpeechService):
    """A Piper VITS voice (``voice``: the ``.onnx``; ``config``: its ``.onnx.json``) as a speech service.

    Raises:
        OSError / ValueError: from piper-tts when the files are not a Piper voice.
    """

    def __init__(self, voice: str | Path, config: str | Path) -> None:
        self.tts = PiperTTS(voice, config)

    def describe(self) -> dict:
        """One voice, no cloning, no instructions."""
        return {"family": "piper", "voices": [{"name": "default"}], "cloning": False, "instructions": False}

    def prepare(self, request: SpeechParams) -> list[str]:
        """The text as the clauses it is spoken in (never raises)."""
        splitter = ClauseSplitter()
        return splitter.push(request.text) + splitter.flush()

    async def stream(self, clauses: list[str]) -> AsyncIterator[np.ndarray]:
        """Each clause's audio at 24 kHz, piece by piece as Piper decodes it (:meth:`PiperTTS.stream`; the
        resampler streams across pieces and clauses, so the joined pieces are one continuous signal)."""
        resampler = soxr.ResampleStream(self.tts.sample_rate, SPEECH_RATE, 1, dtype="float32")
        for i, clause in enumerate(clauses):
            pieces = self.tts.stream(clause)
            while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
                yield resampler.resample_chunk(piece.pcm, last=piece.last and i == len(clauses) - 1)


@lru_cache(maxsize=1)
def packaged_piper() -> PiperSpeech:
    """The packaged voice (en_US joe, ``models/weights.py``), loaded once per process.

    Raises:
        WeightsError: its package is missing or corrupted.
    """
    from omniduplex.models.weights import PIPER_JOE, PIPER_JOE_CONFIG, locate

    return PiperSpeech(locate(PIPER_JOE), locate(PIPER_JOE_CONFIG))
