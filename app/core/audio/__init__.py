"""The audio core under every surface: one int16 convention, one streaming resampler, one reframer, one
20 ms pacing clock, and :class:`AudioPort`, which puts them between a surface's wire codec and a
:class:`~omniduplex.app.core.session.Session`.

A surface (WebRTC, Realtime API, LiveKit, Twilio, SIP) is its signalling plus a codec: it decodes wire
audio to PCM at the wire rate and hands it to :meth:`AudioPort.push`; it encodes what
:meth:`AudioPort.pull` returns, on the ticks of :attr:`AudioPort.pacer`. Nothing else about audio lives in
a surface (pipecat's split of ``serializers/*.py`` from ``transports/base_output.py`` is the model).
"""

from omniduplex.app.core.audio.pacer import Pacer
from omniduplex.app.core.audio.pcm import (
    FRAME_MS,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    frame_samples,
    to_float32,
    to_int16,
)
from omniduplex.app.core.audio.port import AudioPort
from omniduplex.app.core.audio.resample import Reframer, StreamResampler

__all__ = [
    "FRAME_MS",
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "AudioPort",
    "Pacer",
    "Reframer",
    "StreamResampler",
    "frame_samples",
    "to_float32",
    "to_int16",
]
