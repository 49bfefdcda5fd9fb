"""Narrowband telephone audio: the G.711 codec (resampling and framing are
:mod:`omniduplex.app.core.audio`'s).

G.711 (ITU-T Rec. G.711, 1988) codes one 8 kHz sample in one byte:

* μ-law (PCMU, RTP payload type 0, Twilio's ``audio/x-mulaw``): 14-bit linear input, bias 0x84 (132),
  8 segments of 16 steps, all bits inverted on the wire (``0xFF`` is silence).
* A-law (PCMA, RTP payload type 8): 13-bit linear input, 8 segments, even bits inverted (XOR ``0x55``;
  ``0xD5`` is silence).

Both directions are table lookups built once with numpy from the segment formulas (the Sun Microsystems
reference formulation that CPython's ``audioop`` also implements; tests check every code against it):
decoding indexes a 256-entry int16 table, encoding a 65536-entry uint8 table by the int16 sample's bits.
"""

from __future__ import annotations

import numpy as np

TELEPHONE_RATE = 8000
"""G.711 sample rate (Hz)."""
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
