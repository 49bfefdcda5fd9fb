"""Streaming resampling and reframing: the two stateful steps between a wire's chunks and fixed frames."""

from __future__ import annotations

import numpy as np
import soxr

from omniduplex.app.core.audio.pcm import to_float32


class StreamResampler:
    """Streaming mono resampler ``in_rate`` → ``out_rate`` (Hz): soxr ``ResampleStream``, identity when equal.

    soxr keeps the filter state across chunks, so the concatenated output does not depend on how the input
    was split (20 ms chunks join without clicks); per chunk the output length varies by a sample or so, and
    ``HQ`` delays the stream by under ~1 ms at telephone-to-wideband rates. :meth:`process` with a new
    ``in_rate`` (a LiveKit track that changed rate, a Realtime ``session.update`` of the format) starts a new
    stream at that rate.

    Raises:
        ValueError: a rate ≤ 0.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError("sample rates (Hz) must be positive")
        self.out_rate, self.quality = out_rate, quality
        self._start(in_rate)

    def _start(self, in_rate: int) -> None:
        if in_rate <= 0:
            raise ValueError("sample rates (Hz) must be positive")
        self.in_rate = in_rate
        same = in_rate == self.out_rate
        self._rs = None if same else soxr.ResampleStream(in_rate, self.out_rate, 1, "float32", self.quality)

    def process(self, x: np.ndarray, in_rate: int | None = None) -> np.ndarray:
        """Samples (int16 or float in [-1, 1]) at ``in_rate`` → the float32 samples at ``out_rate`` they
        complete."""
        if in_rate is not None and in_rate != self.in_rate:
            self._start(in_rate)
        x = to_float32(x)
        return x if self._rs is None else self._rs.resample_chunk(x)

    def flush(self) -> np.ndarray:
        """The tail the filter holds back (float32), then a fresh stream (e.g. for the next reply)."""
        if self._rs is None:
            return np.zeros(0, np.float32)
        tail: np.ndarray = self._rs.resample_chunk(np.zeros(0, np.float32), last=True)
        self._rs.clear()
        return tail


class Reframer:
    """Regroups a stream of chunks of any length into exact ``size``-sample frames (dtype kept).

    Holds at most ``size - 1`` samples between calls.

    Raises:
        ValueError: ``size`` ≤ 0.
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"frame size must be positive, got {size}")
        self.size = size
        self.buf: np.ndarray | None = None

    def push(self, x: np.ndarray) -> list[np.ndarray]:
        """Append ``x``; returns every complete frame now available, oldest first."""
        x = np.asarray(x).reshape(-1)
        if self.buf is not None and self.buf.size:
            x = np.concatenate([self.buf, x])
        n = x.size // self.size
        self.buf = x[n * self.size :].copy()
        return [x[i * self.size : (i + 1) * self.size] for i in range(n)]

    def clear(self) -> None:
        """Drop the partial frame held."""
        self.buf = None

    @property
    def held(self) -> int:
        """Samples waiting for a whole frame."""
        return 0 if self.buf is None else int(self.buf.size)
