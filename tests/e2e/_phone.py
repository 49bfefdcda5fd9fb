"""Shared by the phone tests: a scripted tone responder, the app under uvicorn on a free loopback port, and
(from :mod:`omniduplex.benchmarks.phone`) the client that plays Twilio's part of a Media Streams call."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import soxr

from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta
from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.benchmarks.phone import phone_audio

QUESTION = Path(__file__).parents[2] / "examples" / "question.wav"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
WORD_S = 0.5
"""Each reply word is 0.5 s of tone: the reply is 3 s."""


def question_8k() -> np.ndarray:
    """``examples/question.wav`` (16 kHz) as 8 kHz int16 through G.711 μ-law, as a phone line carries it."""
    return phone_audio(QUESTION)


class ChunkResponder:
    """Every turn is answered with the same audio chunks ``(float32 PCM at 24 kHz, words)``, generated
    faster than real time; ``cancel`` ends the stream with ``ReplyFailed("cancelled")``."""

    output_rate = 24000

    def __init__(self, chunks: list[tuple[np.ndarray, str]], first_chunk_delay_s: float = 0.05) -> None:
        self.chunks, self.delay = chunks, first_chunk_delay_s
        self.started: list[str] = []
        self.cancelled: set[str] = set()

    def start(self, turn_id, waveform, history, options=None):
        self.started.append(turn_id)

    async def events(self, turn_id):
        await asyncio.sleep(self.delay)
        for i, (pcm, words) in enumerate(self.chunks):
            if turn_id in self.cancelled:
                yield ReplyFailed("cancelled")
                return
            text = words if i == 0 else " " + words
            yield ReplyTextDelta(text)
            yield ReplyAudioChunk(pcm, text)
            await asyncio.sleep(0.05)
        yield ReplyDone({})

    def cancel(self, turn_id):
        self.cancelled.add(turn_id)

    @property
    def audio(self) -> np.ndarray:
        """The whole reply (24 kHz float32)."""
        return np.concatenate([pcm for pcm, _ in self.chunks])


def ToneResponder() -> ChunkResponder:  # noqa: N802 (a responder factory)
    """Six 0.5 s tones, one per word of :data:`WORDS` (a 3 s reply)."""
    t = np.arange(int(WORD_S * 24000)) / 24000
    tones = [(0.3 * np.sin(2 * np.pi * (300 + 50 * i) * t)).astype(np.float32) for i in range(len(WORDS))]
    return ChunkResponder(list(zip(tones, WORDS)))


REPLY_PHRASES = ["The weather today", "is sunny and warm,", "with a light breeze", "from the west."]


def espeak(text: str, rate: int = 24000) -> np.ndarray:
    """``text`` spoken by espeak-ng (en-us), float32 mono at ``rate`` Hz."""
    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "s.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "165", "-w", str(wav), text], check=True)
        x, sr = soundfile.read(wav, dtype="float32")
    return soxr.resample(x, sr, rate).astype(np.float32)


def SpeechResponder() -> ChunkResponder:  # noqa: N802 (a responder factory)
    """A spoken reply (espeak-ng), one chunk per phrase of :data:`REPLY_PHRASES` (~3 s)."""
    return ChunkResponder([(0.8 * espeak(p), p) for p in REPLY_PHRASES])


def free_port(kind=socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ServedApp(app) -> LocalServer:  # noqa: N802 (kept the tests' name)
    """The FastAPI app under uvicorn in a thread (its own event loop), like ``omniduplex serve``."""
    return LocalServer(app, start_timeout_s=300)  # the real cascade loads its stages first (slow when busy)


