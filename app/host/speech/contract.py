"""The host's speech and transcription services: one contract each, and which implementation a server uses.

Speech (``POST /v1/audio/speech``) is a :class:`SpeechService`: :meth:`~SpeechService.prompt` checks one
request before anything is queued (a bad one raises :class:`SpeechError`, costing the others nothing) and
:meth:`~SpeechService.stream` speaks it as float32 mono pieces at :data:`SPEECH_RATE`. Three services keep
it: the packaged Piper voice (:mod:`.piper`, the default), a Qwen3-TTS checkpoint on an engine thread in the
server process (:mod:`.qwen3`), or on its own graph of stage processes (:mod:`.qwen3_graph`). Transcription
(``POST /v1/audio/transcriptions``) is a :class:`Transcriber`: the packaged Whisper tiny.en. Which ones a
server runs: :mod:`.services`.

Text streamed in (``WS /v1/audio/speech/stream``) needs nothing more: it cuts the text into clauses and speaks
each as one request (:meth:`~SpeechService.prompt` then :meth:`~SpeechService.stream`), cancelling a clause by
leaving its stream, so every service serves it as it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from omniduplex.models.cascade.transcript import Transcript

SPEECH_RATE = 24_000
"""Rate of every speech service's pieces (Hz): the API's ``pcm`` format is 24 kHz 16-bit mono."""


class SpeechError(ValueError):
    """A speech request the service cannot serve: ``str(e)`` for the client, ``param`` the request field at
    fault (``None``: the request as a whole), ``code`` the OpenAI-style error code."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class SpeechParams:
    """One ``POST /v1/audio/speech`` request's fields (as the OpenAI API; ``ref_audio`` + ``ref_text`` are an
    extension: a base64 24 kHz WAV to clone, or a ``data:audio/wav;base64,`` URL, and its transcript)."""

    text: str
    voice: str | None = None
    instructions: str | None = None
    language: str = "auto"
    ref_audio: str | None = None
    ref_text: str | None = None


class SpeechService(ABC):
    """Text to speech for ``POST /v1/audio/speech``. A service ignores the fields its model has no use for."""

    sample_rate: int = SPEECH_RATE
    """Rate of the pieces :meth:`stream` yields (Hz)."""

    def prompt(
        self,
        text: str,
        voice: str | None = None,
        instructions: str | None = None,
        language: str = "auto",
        ref_audio: str | None = None,
        ref_text: str | None = None,
    ) -> Any:
        """Check one request (:class:`SpeechParams`'s fields) and package it for :meth:`stream` (blocking:
        call it in a worker thread).

        Raises:
            SpeechError: a field the service cannot serve (an unknown voice, a clip of the wrong rate...).
        """
        return self.prepare(SpeechParams(text, voice, instructions, language, ref_audio, ref_text))

    @abstractmethod
    def prepare(self, request: SpeechParams) -> Any:
        """:meth:`prompt`'s work: check ``request`` and package it (raises :class:`SpeechError`)."""

    @abstractmethod
    def stream(self, prepared: Any) -> AsyncIterator[np.ndarray]:
        """Speak a :meth:`prompt` result: float32 mono ``[n]`` pieces in [-1, 1] as they are made. Leaving the
        iteration early (the client went away) cancels the request.

        Raises:
            SpeechError: the request was refused once queued (before any audio).
        """

    def describe(self) -> dict:
        """What ``GET /v1/audio/voices`` lists for this service: ``family``, ``voices`` (``[{"name"}]``, the
        first the default), whether a request may clone (``cloning``: ``ref_audio``) and whether it reads
        ``instructions``."""
        return {"family": type(self).__name__, "voices": [], "cloning": False, "instructions": False}

    def close(self) -> None:  # noqa: B027 (a service without threads or processes has nothing to free)
        """Free what the service holds (threads, stage processes); requests in flight get no more audio."""


class Transcriber(Protocol):
    """Speech to text for ``POST /v1/audio/transcriptions``."""

    def transcribe(self, wav: np.ndarray) -> Transcript:
        """What ``wav`` (16 kHz mono float32) says, with word timings."""
