"""The input audio buffer of a manual commit: the user audio since the last turn, for surfaces whose client
commits turns itself (Realtime ``input_audio_buffer.commit`` with ``turn_detection: null``, LiveKit's
``commit_audio``) beside the VAD's own turns.

Audio is kept as the 16 kHz int16 chunks it arrived in, up to ``max_s``: :meth:`InputAudioBuffer.append`
drops the oldest chunks to make room (never the new one), :meth:`InputAudioBuffer.fits` says whether a
chunk would fit without that (a surface that must refuse instead asks first). :meth:`InputAudioBuffer.take`
hands the whole buffer over as one float32 waveform for :meth:`Session.commit_audio
<omniduplex.app.core.session.Session.commit_audio>` and empties it; under :data:`MIN_COMMIT_MS` there is
nothing to commit (the Realtime API's rule: 100 ms).
"""

from __future__ import annotations

import numpy as np

from omniduplex.app.core.audio.pcm import SAMPLE_RATE, to_float32

MIN_COMMIT_MS = 100
"""Least audio a commit takes (ms; the Realtime API's ``input_audio_buffer_commit_empty`` limit)."""


class InputAudioBuffer:
    """User audio since the last turn (16 kHz mono int16), at most ``max_s`` seconds."""

    def __init__(self, max_s: float = 60.0) -> None:
        self.max_samples = int(max_s * SAMPLE_RATE)
        self._chunks: list[np.ndarray] = []
        self.samples = 0
        """Samples held (16 kHz)."""

    @property
    def ms(self) -> int:
        """Audio held (whole ms)."""
        return 1000 * self.samples // SAMPLE_RATE

    def fits(self, n: int) -> bool:
        """Whether ``n`` more samples fit without dropping any held audio."""
        return self.samples + n <= self.max_samples

    def append(self, pcm: np.ndarray) -> None:
        """Keep ``pcm`` (16 kHz int16), dropping the oldest chunks while it would not fit."""
        while self._chunks and not self.fits(pcm.size):
            self.samples -= self._chunks.pop(0).size
        self._chunks.append(pcm)
        self.samples += pcm.size

    def clear(self) -> None:
        """Drop everything held."""
        self._chunks, self.samples = [], 0

    def take(self) -> np.ndarray | None:
        """Everything held as one float32 waveform in [-1, 1], the buffer emptied; ``None`` (and the buffer
        kept) under :data:`MIN_COMMIT_MS`."""
        if self.ms < MIN_COMMIT_MS:
            return None
        wav = to_float32(np.concatenate(self._chunks))
        self.clear()
        return wav
