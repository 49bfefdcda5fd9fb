"""LiveKit audio frames ↔ the PCM of :mod:`omniduplex.app.core.audio` (which resamples and frames them).

LiveKit hands a realtime model :class:`rtc.AudioFrame` s of interleaved int16 at whatever rate and channel
count the room track has (``room_io`` defaults to 24 kHz mono, 10–20 ms per frame); it plays back any
frames it is given.
"""

from __future__ import annotations

import numpy as np
from livekit import rtc

from omniduplex.app.core.audio import to_int16


def frame_pcm(frame: rtc.AudioFrame) -> tuple[np.ndarray, int, int]:
    """A room frame as ``(interleaved int16 samples, sample rate Hz, channel count)``."""
    return np.frombuffer(frame.data, np.int16), frame.sample_rate, frame.num_channels


def pcm_frame(pcm: np.ndarray, rate: int) -> rtc.AudioFrame:
    """Mono samples (int16, or float in [-1, 1]) at ``rate`` (Hz) as one int16 :class:`rtc.AudioFrame`."""
    pcm = np.ascontiguousarray(to_int16(pcm))
    return rtc.AudioFrame(data=pcm.tobytes(), sample_rate=rate, num_channels=1, samples_per_channel=pcm.size)
