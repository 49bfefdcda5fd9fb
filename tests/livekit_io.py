"""In-memory LiveKit audio I/O for AgentSession tests (no LiveKit server, no room).

:class:`MicInput` plays queued PCM as 20 ms frames at real-time pace, silence in between, like a
microphone track. :class:`SpeakerOutput` is a real-time sink: frames play one after another from when they
arrive, ``clear_buffer`` stops playback and reports the position actually played (as the room's audio
output does), ``flush`` reports completion when the last frame has played. Everything it played is kept.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import soxr
from livekit import rtc
from livekit.agents.voice import io

from omniduplex.pipeline.audio_io import load_audio

RATE = 24000
FRAME = 480  # 20 ms at 24 kHz


def speech(path, rate: int = RATE, lead_s: float = 0.3, tail_s: float = 1.2) -> np.ndarray:
    """A speech file as int16 mono at ``rate``, with silence before and after (the tail ends the turn)."""
    x = soxr.resample(load_audio(path), 16000, rate).astype(np.float32)
    x = np.concatenate(
        [np.zeros(int(rate * lead_s), np.float32), x, np.zeros(int(rate * tail_s), np.float32)]
    )
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)


class MicInput(io.AudioInput):
    """Real-time microphone: queued PCM (int16 at 24 kHz), then silence."""

    def __init__(self) -> None:
        super().__init__(label="test-mic")
        self.pending = np.zeros(0, np.int16)
        self.t0: float | None = None
        self.n = 0
        self.closed = False

    def say(self, pcm: np.ndarray) -> float:
        """Queue ``pcm``; returns how long until it has all been sent (s)."""
        self.pending = np.concatenate([self.pending, pcm])
        return self.pending.size / RATE

    async def __anext__(self) -> rtc.AudioFrame:
        if self.closed:
            raise StopAsyncIteration
        if self.t0 is None:
            self.t0 = time.monotonic()
        self.n += 1
        await asyncio.sleep(max(0.0, self.t0 + self.n * FRAME / RATE - time.monotonic()))
        chunk, self.pending = self.pending[:FRAME], self.pending[FRAME:]
        pcm = np.zeros(FRAME, np.int16)
        pcm[: chunk.size] = chunk
        return rtc.AudioFrame(pcm.tobytes(), RATE, 1, FRAME)


class SpeakerOutput(io.AudioOutput):
    """Real-time speaker: keeps every frame it played (``played``) and every playback report (``reports``)."""

    def __init__(self) -> None:
        super().__init__(
            label="test-speaker", capabilities=io.AudioOutputCapabilities(pause=False), sample_rate=None
        )
        self.frames: list[tuple[float, rtc.AudioFrame]] = []  # (start time, frame) of the current segment
        self.end = 0.0  # when the queued audio has all played (monotonic s)
        self.pushed = 0.0  # s of audio captured in the current segment
        self.played: list[np.ndarray] = []  # int16 audio that played, all segments
        self.reports: list[tuple[float, bool]] = []  # (playback_position s, interrupted)
        self.segments = 0  # segments (replies) that started playing
        self.wait: asyncio.Task | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        now = time.monotonic()
        if not self.frames:
            self.segments += 1
            self.on_playback_started(created_at=time.time())
        start = max(now, self.end)
        self.end = start + frame.duration
        self.pushed += frame.duration
        self.frames.append((start, frame))

    def position(self) -> float:
        """Seconds of the current segment played by now (0 between segments), on the speaker's clock."""
        now = time.monotonic()
        return sum(min(max(0.0, now - start), f.duration) for start, f in self.frames)

    def flush(self) -> None:
        super().flush()
        if self.frames:
            self.wait = asyncio.get_running_loop().create_task(self._finish())

    async def _finish(self) -> None:
        await asyncio.sleep(max(0.0, self.end - time.monotonic()))
        self._report(self.pushed, False)

    def clear_buffer(self) -> None:
        if not self.frames:
            return
        if self.wait is not None:
            self.wait.cancel()
        self._report(self.position(), True)

    def _report(self, position: float, interrupted: bool) -> None:
        now = time.monotonic()
        for start, f in self.frames:
            share = min(max(0.0, now - start), f.duration) if interrupted else f.duration
            pcm = np.frombuffer(f.data, np.int16)
            self.played.append(pcm[: round(share * f.sample_rate)])
        self.frames, self.pushed, self.end, self.wait = [], 0.0, 0.0, None
        self.reports.append((position, interrupted))
        self.on_playback_finished(playback_position=position, interrupted=interrupted)

    def audio(self) -> np.ndarray:
        """Everything played so far (int16, the frames' rate; 24 kHz from our plugins)."""
        return np.concatenate(self.played) if self.played else np.zeros(0, np.int16)
