"""The reply playout buffer: pipeline PCM in (24 kHz chunks), fixed-size frames out at the transport rate.

The transport pulls one frame per frame period (20 ms) at real-time pace, so audio waits here, not
in the transport, and a barge-in drops all of it at once with :meth:`PlayoutBuffer.flush`.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import soxr


class PlayoutBuffer:
    """Queue of reply audio at ``out_rate`` (Hz), fed at ``in_rate`` (Hz) through a streaming resampler.

    ``read(n)`` returns exactly ``n`` int16 samples (zeros past the end) and how many were audio.
    """

    def __init__(self, in_rate: int = 24000, out_rate: int = 48000) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self.chunks: deque[np.ndarray] = deque()
        self.head = 0  # samples of chunks[0] already read
        self.queued = 0  # samples waiting (out_rate)
        self._resampler = self._new_resampler()

    def _new_resampler(self) -> soxr.ResampleStream | None:
        if self.in_rate == self.out_rate:
            return None
        return soxr.ResampleStream(self.in_rate, self.out_rate, 1, dtype="float32", quality="HQ")

    def push(self, pcm: np.ndarray, last: bool = False) -> int:
        """Queue float32 PCM at ``in_rate``; ``last`` flushes the resampler tail. Returns samples queued."""
        x = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        y = self._resampler.resample_chunk(x, last=last) if self._resampler else x
        if last and self._resampler:
            self._resampler = self._new_resampler()
        if y.size:
            self.chunks.append((np.clip(y, -1.0, 1.0) * 32767.0).astype(np.int16))
            self.queued += y.size
        return int(y.size)

    def read(self, n: int) -> tuple[np.ndarray, int]:
        """Next ``n`` samples (int16, zero-padded) and the number of them that came from the queue."""
        out = np.zeros(n, np.int16)
        filled = 0
        while filled < n and self.chunks:
            c = self.chunks[0]
            take = min(n - filled, c.size - self.head)
            out[filled : filled + take] = c[self.head : self.head + take]
            filled += take
            self.head += take
            if self.head == c.size:
                self.chunks.popleft()
                self.head = 0
        self.queued -= filled
        return out, filled

    def flush(self) -> int:
        """Drop everything queued (barge-in) and reset the resampler; returns samples dropped."""
        dropped = self.queued
        self.chunks.clear()
        self.head = self.queued = 0
        self._resampler = self._new_resampler()
        return dropped

    @property
    def queued_ms(self) -> float:
        """Audio waiting to be read (ms)."""
        return 1000.0 * self.queued / self.out_rate
