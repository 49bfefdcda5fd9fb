"""LiveKit audio frames ↔ the PCM our sessions speak.

LiveKit hands a realtime model :class:`rtc.AudioFrame` s of interleaved int16 at whatever rate and channel
count the room track has (``room_io`` defaults to 24 kHz mono, 10–20 ms per frame); it plays back any
frames it is given. The pipeline's :class:`~omniduplex.app.session.Session` takes 20 ms frames of 16 kHz
mono int16 (320 samples), and the Realtime API takes 24 kHz PCM16. Resampling is streaming
(``soxr.ResampleStream`` keeps filter state across frames, so the output does not depend on how the input
was split); a change of input rate starts a new stream.
"""

from __future__ import annotations

import numpy as np
import soxr
from livekit import rtc


class MonoResampler:
    """:class:`rtc.AudioFrame` (int16, any rate, any channel count) → float32 mono at ``out_rate`` (Hz)."""

    def __init__(self, out_rate: int) -> None:
        self.out_rate = out_rate
        self._in_rate: int | None = None
        self._stream: soxr.ResampleStream | None = None

    def push(self, frame: rtc.AudioFrame) -> np.ndarray:
        """The float32 samples (in [-1, 1)) this frame completes; channels are averaged."""
        pcm = np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768.0
        if frame.num_channels > 1:
            pcm = pcm.reshape(-1, frame.num_channels).mean(axis=1)
        if frame.sample_rate != self._in_rate:
            self._in_rate = frame.sample_rate
            self._stream = (
                None
                if frame.sample_rate == self.out_rate
                else soxr.ResampleStream(frame.sample_rate, self.out_rate, 1, dtype="float32", quality="HQ")
            )
        return pcm if self._stream is None else self._stream.resample_chunk(pcm)


class FrameSplitter:
    """A float32 stream → fixed frames of ``size`` samples as int16 (the remainder waits for more)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._carry = np.zeros(0, np.float32)

    def push(self, x: np.ndarray) -> list[np.ndarray]:
        x = np.concatenate([self._carry, x]) if self._carry.size else x
        whole = x.size // self.size * self.size
        self._carry = x[whole:]
        pcm = to_int16(x[:whole])
        return [pcm[i : i + self.size] for i in range(0, whole, self.size)]

    def clear(self) -> None:
        self._carry = np.zeros(0, np.float32)


def to_int16(x: np.ndarray) -> np.ndarray:
    """float in [-1, 1] → int16 (rounded, clipped); int16 passes through."""
    if x.dtype == np.int16:
        return x
    return np.clip(np.rint(x * 32768.0), -32768, 32767).astype(np.int16)


def pcm_frame(pcm: np.ndarray, rate: int) -> rtc.AudioFrame:
    """Mono int16 samples at ``rate`` (Hz) as one :class:`rtc.AudioFrame`."""
    pcm = np.ascontiguousarray(to_int16(pcm))
    return rtc.AudioFrame(data=pcm.tobytes(), sample_rate=rate, num_channels=1, samples_per_channel=pcm.size)
