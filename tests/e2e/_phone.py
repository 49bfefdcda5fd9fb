"""Shared by the phone tests: a scripted tone responder, the app under uvicorn on a free loopback port, and a
client that plays Twilio's part of a Media Streams call (real-time audio both ways, marks, clear)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np
import soundfile
import soxr

from omniduplex.app.audio import frame_samples
from omniduplex.app.phone.narrowband import TELEPHONE_RATE, ULAW_SILENCE, ulaw_decode, ulaw_encode
from omniduplex.app.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta
from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.pipeline.audio_io import load_audio

FRAME_SAMPLES = frame_samples(TELEPHONE_RATE)  # one 20 ms G.711 frame (160 samples)

QUESTION = Path(__file__).parents[2] / "examples" / "question.wav"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
WORD_S = 0.5
"""Each reply word is 0.5 s of tone: the reply is 3 s."""


def question_8k() -> np.ndarray:
    """``examples/question.wav`` (16 kHz) as 8 kHz int16 through G.711 μ-law, as a phone line carries it."""
    x = soxr.resample(load_audio(QUESTION), 16000, 8000)
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16)
    return ulaw_decode(ulaw_encode(pcm))


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


class FakeTwilio:
    """Twilio's side of one bidirectional stream: sends the caller's audio every 20 ms (``say`` queues
    speech, silence otherwise), buffers our media and plays it at real time, echoes each mark when the
    audio before it has played, and on ``clear`` drops the buffer and echoes the pending marks at once."""

    def __init__(self, ws, stream_sid: str = "MZtest", call_sid: str = "CAtest") -> None:
        self.ws, self.sid, self.call_sid = ws, stream_sid, call_sid
        self.mic: deque[np.ndarray] = deque()
        self.buffer: deque[np.ndarray] = deque()  # received, not yet played (8 kHz int16 frames)
        self.pending_marks: list[tuple[int, str]] = []  # (received samples at the mark, name)
        self.received = self.played = 0  # reply samples
        self.played_audio: list[tuple[float, np.ndarray]] = []  # (time, frame) of audible reply frames
        self.marks_sent_back: list[str] = []
        self.marks_received: list[str] = []
        self.clears: list[float] = []
        self.media_messages = 0
        self.speech_ends: list[float] = []  # when each queued utterance finished
        self.closed = False

    def say(self, pcm8k: np.ndarray) -> None:
        n = pcm8k.size // FRAME_SAMPLES
        self.mic.extend(pcm8k[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(n))

    async def send(self, obj) -> None:
        await self.ws.send(obj if isinstance(obj, str) else json.dumps(obj))

    async def start(self, media_format: dict | None = None) -> None:
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        fmt = media_format or {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
        start = {
            "streamSid": self.sid,
            "callSid": self.call_sid,
            "accountSid": "ACtest",
            "tracks": ["inbound"],
            "mediaFormat": fmt,
            "customParameters": {"caller": "test"},
        }
        await self.send({"event": "start", "sequenceNumber": "1", "streamSid": self.sid, "start": start})

    async def run(self) -> None:
        """The 20 ms tick (mic out, playback) and the receive loop, until the socket closes."""
        await asyncio.gather(self._tick(), self._receive())

    async def _tick(self) -> None:
        t0, n, chunk, speaking = time.monotonic(), 0, 0, False
        while not self.closed:
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.020 - time.monotonic()))
            frame = self.mic.popleft() if self.mic else None
            if frame is not None:
                speaking = True
            elif speaking:
                self.speech_ends.append(time.monotonic())
                speaking = False
            payload = ulaw_encode(frame) if frame is not None else bytes([ULAW_SILENCE]) * FRAME_SAMPLES
            chunk += 1
            media = {
                "track": "inbound",
                "chunk": str(chunk),
                "timestamp": str(20 * chunk),
                "payload": base64.b64encode(payload).decode(),
            }
            try:
                await self.send({"event": "media", "streamSid": self.sid, "media": media})
            except Exception:
                return
            self._play()

    def _play(self) -> None:
        if not self.buffer:
            return
        frame = self.buffer.popleft()
        self.played += frame.size
        if np.abs(frame.astype(np.int32)).max() > 100:
            self.played_audio.append((time.monotonic(), frame))
        while self.pending_marks and self.pending_marks[0][0] <= self.played:
            self._echo(self.pending_marks.pop(0)[1])

    def _echo(self, name: str) -> None:
        self.marks_sent_back.append(name)
        msg = {"event": "mark", "sequenceNumber": "0", "streamSid": self.sid, "mark": {"name": name}}
        asyncio.get_running_loop().create_task(self.send(msg))

    async def _receive(self) -> None:
        try:
            async for text in self.ws:
                msg = json.loads(text)
                if msg["event"] == "media":
                    assert msg["streamSid"] == self.sid
                    pcm = ulaw_decode(base64.b64decode(msg["media"]["payload"]))
                    self.media_messages += 1
                    self.buffer.append(pcm)
                    self.received += pcm.size
                elif msg["event"] == "mark":
                    self.marks_received.append(msg["mark"]["name"])
                    self.pending_marks.append((self.received, msg["mark"]["name"]))
                elif msg["event"] == "clear":
                    self.clears.append(time.monotonic())
                    self.buffer.clear()
                    self.received = self.played
                    for _, name in self.pending_marks:
                        self._echo(name)
                    self.pending_marks.clear()
        finally:
            self.closed = True

    @property
    def first_reply_audio_at(self) -> float | None:
        return self.played_audio[0][0] if self.played_audio else None

    def reply_seconds_played(self) -> float:
        return len(self.played_audio) * FRAME_SAMPLES / 8000
