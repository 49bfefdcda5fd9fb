"""Realtime API audio formats ↔ float32 PCM, with streaming resampling to and from the session rates.

The GA API has three formats (``session.audio.input|output.format``; API reference "Realtime audio
formats"), all mono, base64 on the wire:

* ``audio/pcm``: 16-bit signed little-endian PCM at 24000 Hz (2 bytes per sample; 20 ms = 960 bytes).
* ``audio/pcmu``: G.711 μ-law at 8000 Hz (1 byte per sample; 20 ms = 160 bytes).
* ``audio/pcma``: G.711 A-law at 8000 Hz (1 byte per sample).

G.711 (ITU-T Rec. G.711) is the phone bridge's numpy table codec (:mod:`omniduplex.app.surfaces.wire.g711`,
checked code-for-code against CPython's ``audioop``); one copy serves both transports.

A connection decodes each payload to int16 at its format's rate (:func:`decode_payload`) and hands it
to its :class:`~omniduplex.app.core.audio.AudioPort` (16 kHz session frames); reply audio (24 kHz int16 from
the port) goes out through one :class:`OutputConverter` per response (the core's streaming resampler to the
client's rate, then the format's encoder). PCM conventions are :mod:`omniduplex.app.core.audio.pcm`'s.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

import numpy as np

from omniduplex.app.core.audio import StreamResampler, to_int16
from omniduplex.app.surfaces.wire.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from omniduplex.app.surfaces.wire.realtime.protocol import INVALID_AUDIO, ProtocolError

FormatType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]

PCM_RATE = 24000
"""``audio/pcm`` sample rate (Hz); the API allows no other."""
G711_RATE = 8000
"""``audio/pcmu`` / ``audio/pcma`` sample rate (Hz)."""
SESSION_OUTPUT_RATE = 24000
"""Rate the bridge pulls assistant audio at (Hz; ``SessionConfig.output_rate``); ``audio/pcm`` as is."""

FORMAT_RATE: dict[str, int] = {"audio/pcm": PCM_RATE, "audio/pcmu": G711_RATE, "audio/pcma": G711_RATE}
"""Format → sample rate (Hz)."""
BYTES_PER_SAMPLE: dict[str, int] = {"audio/pcm": 2, "audio/pcmu": 1, "audio/pcma": 1}
"""Format → bytes per sample."""


def format_type(fmt: Any) -> FormatType:
    """``"audio/pcmu"`` from a format type string or a format model / dict with a ``type``."""
    t = (
        fmt
        if isinstance(fmt, str)
        else fmt.get("type")
        if isinstance(fmt, dict)
        else getattr(fmt, "type", None)
    )
    if t not in FORMAT_RATE:
        raise ValueError(f"unknown audio format {t!r}; expected one of {list(FORMAT_RATE)}")
    return t


def b64decode(data: str, event_id: str | None = None) -> bytes:
    """Base64 text (ASCII whitespace ignored) → bytes; ``ProtocolError(invalid_audio)`` if malformed."""
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ProtocolError(INVALID_AUDIO, f"audio is not valid base64: {e}", event_id, "audio") from None


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode(data: bytes, fmt: Any, event_id: str | None = None) -> np.ndarray:
    """Audio bytes in ``fmt`` → int16 samples at the format's rate (:data:`FORMAT_RATE`).

    ``ProtocolError(invalid_audio)`` for PCM16 with an odd byte count (not whole samples).
    """
    t = format_type(fmt)
    if t == "audio/pcm":
        if len(data) % 2:
            msg = f"audio/pcm is 16-bit: {len(data)} bytes is not a whole number of samples"
            raise ProtocolError(INVALID_AUDIO, msg, event_id, "audio")
        return np.frombuffer(data, "<i2").astype(np.int16)
    return ulaw_decode(data) if t == "audio/pcmu" else alaw_decode(data)


def decode_payload(audio: str | bytes, fmt: Any, event_id: str | None = None) -> np.ndarray:
    """One ``input_audio_buffer.append`` / ``input_audio`` payload (base64 ``str`` or raw ``bytes``) in
    ``fmt`` → int16 samples at the format's rate; ``ProtocolError(invalid_audio)`` when malformed."""
    return decode(b64decode(audio, event_id) if isinstance(audio, str) else audio, fmt, event_id)


def encode(samples: np.ndarray, fmt: Any) -> bytes:
    """Samples (float32 in [-1, 1] or int16) at the format's rate → audio bytes in ``fmt``."""
    t, pcm = format_type(fmt), to_int16(samples)
    if t == "audio/pcm":
        return pcm.astype("<i2", copy=False).tobytes()
    return ulaw_encode(pcm) if t == "audio/pcmu" else alaw_encode(pcm)


class OutputConverter:
    """Session output audio (float32 or int16 at ``in_rate`` Hz) → bytes in the client's ``fmt``.

    Base64-encode for ``response.output_audio.delta`` (its builder accepts the bytes directly).
    """

    def __init__(self, fmt: Any, in_rate: int = SESSION_OUTPUT_RATE) -> None:
        self.format = format_type(fmt)
        self.resampler = StreamResampler(in_rate, FORMAT_RATE[self.format])

    def push(self, samples: np.ndarray) -> bytes:
        return encode(self.resampler.process(samples), self.format)

    def flush(self) -> bytes:
        """The resampler's tail at end of a response (empty for ``audio/pcm`` at 24 kHz)."""
        return encode(self.resampler.flush(), self.format)

    @staticmethod
    def bytes_per_ms(fmt: Any) -> float:
        """Wire bytes per ms of audio in ``fmt`` (48 for ``audio/pcm``, 8 for G.711)."""
        t = format_type(fmt)
        return FORMAT_RATE[t] * BYTES_PER_SAMPLE[t] / 1000.0
