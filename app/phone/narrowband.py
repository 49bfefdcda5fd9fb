"""Narrowband telephone audio: the G.711 codec and the 8 kHz ↔ session-rate resamplers.

G.711 (ITU-T Rec. G.711, 1988) codes one 8 kHz sample in one byte:

* μ-law (PCMU, RTP payload type 0, Twilio's ``audio/x-mulaw``): 14-bit linear input, bias 0x84 (132),
  8 segments of 16 steps, all bits inverted on the wire (``0xFF`` is silence).
* A-law (PCMA, RTP payload type 8): 13-bit linear input, 8 segments, even bits inverted (XOR ``0x55``;
  ``0xD5`` is silence).

Both directions are table lookups built once with numpy from the segment formulas (the Sun Microsystems
reference formulation that CPython's ``audioop`` also implements; tests check every code against it):
decoding indexes a 256-entry int16 table, encoding a 65536-entry uint8 table by the int16 sample's bits.

Resampling uses soxr streaming resamplers (state carried across chunks, so 20 ms frames join without
clicks); their output length per chunk varies by a sample or two, so :class:`Reframer` regroups the
stream into exact frames.
"""

from __future__ import annotations

import numpy as np
import soxr

TELEPHONE_RATE = 8000
"""G.711 sample rate (Hz)."""
FRAME_MS = 20
"""Telephone frame period: Twilio media messages and RTP packets (ptime) (ms)."""
FRAME_SAMPLES = TELEPHONE_RATE * FRAME_MS // 1000
"""Samples (= G.711 bytes) in one 20 ms telephone frame (160)."""
ULAW_SILENCE = 0xFF
"""μ-law code of 0."""
ALAW_SILENCE = 0xD5
"""A-law code of 0."""

_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159  # 14-bit magnitude limit (8191 - bias/4)
_SEG_ULAW_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_SEG_ALAW_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


def _ulaw_encode_table() -> np.ndarray:
    x = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14-bit
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_SEG_ULAW_END, mag)  # first segment whose end >= mag
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0x0F))
    return _by_bits((code ^ mask).astype(np.uint8))


def _alaw_encode_table() -> np.ndarray:
    x = np.arange(-32768, 32768, dtype=np.int32) >> 3  # 13-bit
    mask = np.where(x >= 0, 0xD5, 0x55)
    mag = np.where(x >= 0, x, -x - 1)
    seg = np.searchsorted(_SEG_ALAW_END, mag)
    quant = np.where(seg < 2, mag >> 1, mag >> np.maximum(seg, 1)) & 0x0F
    code = np.where(seg >= 8, 0x7F, (seg << 4) | quant)
    return _by_bits((code ^ mask).astype(np.uint8))


def _by_bits(table_from_min: np.ndarray) -> np.ndarray:
    """Reorder a table indexed by ``sample + 32768`` to one indexed by the sample's uint16 bit pattern."""
    return np.roll(table_from_min, 32768)


_ULAW_DEC, _ALAW_DEC = _ulaw_decode_table(), _alaw_decode_table()
_ULAW_ENC, _ALAW_ENC = _ulaw_encode_table(), _alaw_encode_table()


def ulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes → int16 PCM, one sample per byte."""
    return _ULAW_DEC[np.frombuffer(data, np.uint8)]


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """int16 PCM → μ-law bytes, one byte per sample (ITU-T G.711; same codes as ``audioop.lin2ulaw``)."""
    return _ULAW_ENC[np.asarray(pcm, np.int16).view(np.uint16)].tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes → int16 PCM, one sample per byte."""
    return _ALAW_DEC[np.frombuffer(data, np.uint8)]


def alaw_encode(pcm: np.ndarray) -> bytes:
    """int16 PCM → A-law bytes, one byte per sample (ITU-T G.711; same codes as ``audioop.lin2alaw``)."""
    return _ALAW_ENC[np.asarray(pcm, np.int16).view(np.uint16)].tobytes()


CODECS = {"PCMU": (ulaw_encode, ulaw_decode, ULAW_SILENCE), "PCMA": (alaw_encode, alaw_decode, ALAW_SILENCE)}
"""G.711 codec name (SDP encoding name, RFC 3551) → ``(encode, decode, silence byte)``."""


class Reframer:
    """Regroups a stream of int16 chunks of any length into exact ``size``-sample frames.

    Holds at most ``size - 1`` samples between calls.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.buf = np.zeros(0, np.int16)

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        """Append ``pcm``; returns every complete frame now available, oldest first."""
        x = np.concatenate([self.buf, pcm]) if self.buf.size else np.asarray(pcm, np.int16)
        n = x.size // self.size
        frames = [x[i * self.size : (i + 1) * self.size] for i in range(n)]
        self.buf = x[n * self.size :].copy()
        return frames


class StreamResampler:
    """A streaming int16 resampler from ``in_rate`` to ``out_rate`` (Hz) with exact output frames.

    ``push(pcm)`` returns the complete ``frame_samples``-long frames (at ``out_rate``) now available.
    soxr ``HQ`` quality: its filter delay is ~1 ms at these rates, paid once at the start of the stream.
    Equal rates pass through unchanged (only reframed).
    """

    def __init__(self, in_rate: int, out_rate: int, frame_samples: int) -> None:
        if in_rate <= 0 or out_rate <= 0 or frame_samples <= 0:
            raise ValueError("rates (Hz) and frame size (samples) must be positive")
        self.in_rate, self.out_rate = in_rate, out_rate
        self.reframer = Reframer(frame_samples)
        self._rs = None
        if in_rate != out_rate:
            self._rs = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        """Resample one chunk of int16 PCM at ``in_rate``; returns the frames completed by it."""
        x = np.asarray(pcm, np.int16).reshape(-1)
        if self._rs is not None:
            y = self._rs.resample_chunk(x.astype(np.float32) / 32768.0)
            x = (np.clip(y, -1.0, 32767.0 / 32768.0) * 32768.0).astype(np.int16)
        return self.reframer.push(x)


def upsampler_8k_to_16k() -> StreamResampler:
    """8 kHz telephone audio → the session's 16 kHz input, in 20 ms (320-sample) frames."""
    return StreamResampler(TELEPHONE_RATE, 16000, 320)
