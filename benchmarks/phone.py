"""``omniduplex bench phone``: concurrent calls over the Twilio Media Streams protocol, each asking a spoken
question in real time as μ-law 8 kHz, timed from the end of the caller's speech to the first reply media.

Each call connects to ``/phone/twilio/stream`` of an ``omniduplex serve`` started here (stage processes, the
default cascade unless ``--model``), plays Twilio's part (:class:`TwilioCaller`: 20 ms ``media`` frames both
ways, marks, ``clear``) and measures, per call:

* **speech end → first media**: from the caller's last voiced frame sent to the first reply ``media``
  message with audible audio received (ms; the server's endpointing silence included: a phone user's wait);
* the same at the server (``speech_end_to_first_audio_ms`` of ``/metrics``: from the end of speech the VAD
  saw to the first reply frame sent);
* where a level's time goes, medians over its calls (:data:`SPLIT`, the orchestrator's
  :attr:`~omniduplex.pipeline.orchestrator.Orchestrator.ttfp_splits`): turn committed → first audio out of
  the pipeline (``ttfp``) and its parts: ASR (submit → transcript), LLM first token (transcript → first reply
  token), LLM first clause (transcript → first clause audio, less the TTS parts), the first clause's wait in
  the TTS stage behind other calls' pieces, and its synthesis. The rest of speech end → first media is the
  endpointing silence, the session's pacing and the wire.

Levels run one after another (default c = 1, 4); p50/p90 over the calls of a level. Protocol:
twilio.com/docs/voice/media-streams/websocket-messages.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import deque
from pathlib import Path

import numpy as np
import soxr
import websockets

from omniduplex.app.core.audio import frame_samples
from omniduplex.app.surfaces.wire.g711 import TELEPHONE_RATE, ULAW_SILENCE, ulaw_decode, ulaw_encode
from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.pipeline.audio_io import load_audio

FRAME_SAMPLES = frame_samples(TELEPHONE_RATE)
"""One 20 ms G.711 frame at 8 kHz (160 samples)."""
AUDIBLE = 100
"""A reply frame is audible when a sample's magnitude exceeds this (int16)."""
VOICED_RMS = 330.0
"""A caller frame counts as speech above this RMS (int16; about -40 dBFS): the end of speech is the last
such frame of an utterance, not the end of its file (a WAV's trailing quiet is not speech)."""


SPLIT = {
    "ttfp_ms": "TTFP",
    "asr_wall_ms": "ASR",
    "llm_first_token_ms": "LLM 1st token",
    "llm_first_clause_ms": "LLM 1st clause",
    "tts_wait_ms": "TTS wait",
    "tts_first_chunk_ms": "TTS 1st piece",
}
"""The TTFP split the table prints (key of a ``ttfp_splits`` entry → column), ms."""


def _rms(frame: np.ndarray) -> float:
    return float(np.sqrt(np.mean(frame.astype(np.float64) ** 2)))


def phone_audio(path: Path) -> np.ndarray:
    """A 16 kHz speech WAV as 8 kHz int16 through G.711 μ-law, as a phone line carries it."""
    x = soxr.resample(load_audio(path), 16000, TELEPHONE_RATE)
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16)
    return ulaw_decode(ulaw_encode(pcm))


class TwilioCaller:
    """Twilio's side of one bidirectional stream: sends the caller's audio every 20 ms (``say`` queues
    speech, silence otherwise), buffers our media and plays it at real time, echoes each mark when the
    audio before it has played, and on ``clear`` drops the buffer and echoes the pending marks at once."""

    def __init__(self, ws, stream_sid: str = "MZtest", call_sid: str = "CAtest") -> None:
        self.ws, self.sid, self.call_sid = ws, stream_sid, call_sid
        self.mic: deque[tuple[np.ndarray, bool]] = deque()  # (frame, whether it ends an utterance's speech)
        self.buffer: deque[np.ndarray] = deque()  # received, not yet played (8 kHz int16 frames)
        self.pending_marks: list[tuple[int, str]] = []  # (received samples at the mark, name)
        self.received = self.played = 0  # reply samples
        self.played_audio: list[tuple[float, np.ndarray]] = []  # (time, frame) of audible reply frames
        self.received_audio_at: list[float] = []  # arrival times of audible reply media messages
        self.marks_sent_back: list[str] = []
        self.marks_received: list[str] = []
        self.clears: list[float] = []
        self.media_messages = 0
        self.speech_ends: list[float] = []  # when the last voiced frame of each utterance was sent
        self.closed = False

    def say(self, pcm8k: np.ndarray) -> None:
        n = pcm8k.size // FRAME_SAMPLES
        frames = [pcm8k[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(n)]
        voiced = [i for i, f in enumerate(frames) if _rms(f) > VOICED_RMS]
        last = voiced[-1] if voiced else -1
        self.mic.extend((f, i == last) for i, f in enumerate(frames))

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
        t0, n, chunk = time.monotonic(), 0, 0
        while not self.closed:
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.020 - time.monotonic()))
            frame, ends = self.mic.popleft() if self.mic else (None, False)
            if ends:
                self.speech_ends.append(time.monotonic())
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
        if np.abs(frame.astype(np.int32)).max() > AUDIBLE:
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
                    if np.abs(pcm.astype(np.int32)).max() > AUDIBLE:
                        self.received_audio_at.append(time.monotonic())
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

    @property
    def first_reply_media_at(self) -> float | None:
        """When the first audible reply media message arrived (``time.monotonic``)."""
        return self.received_audio_at[0] if self.received_audio_at else None


async def _call(url: str, question: np.ndarray, timeout: float) -> float | None:
    """One call: 0.25 s of silence, the question, then silence until the first reply media; returns speech
    end → first media (ms), or ``None`` on a timeout."""
    async with websockets.connect(url) as ws:
        tw = TwilioCaller(ws)
        await tw.start()
        runner = asyncio.create_task(tw.run())
        tw.say(np.zeros(2000, np.int16))
        tw.say(question)
        deadline = time.monotonic() + timeout
        while tw.first_reply_media_at is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        got = tw.first_reply_media_at
        await tw.send({"event": "stop", "streamSid": tw.sid, "stop": {}})
        runner.cancel()
        if got is None or not tw.speech_ends:
            return None
        return 1000 * (got - tw.speech_ends[0])


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run(
    levels: list[int],
    question: Path,
    model: str | None = None,
    json_out: Path | None = None,
    timeout: float = 120.0,
) -> dict:
    """Serve ``model`` (stage processes) here, run one warm-up call, then each level of concurrent calls;
    prints a markdown table and returns ``{c: metrics}``.

    Raises:
        RuntimeError: the server did not come up.
    """
    from omniduplex.app.server import ServerConfig, create_app

    srv = LocalServer(create_app(ServerConfig(max_sessions=64, processes=True, model=model, max_tokens=32)))
    srv.start()
    url = srv.url("/phone/twilio/stream", "ws")
    q = phone_audio(question)
    results = {}
    try:
        asyncio.run(_call(url, q, timeout))  # warm-up
        for c in levels:
            splits = srv.state.orchestrator.ttfp_splits
            splits.clear()
            got = asyncio.run(_level(url, q, c, timeout))
            ok = [x for x in got if x is not None]
            results[c] = {
                "calls": c,
                "first_media_p50_ms": _pct(ok, 50),
                "first_media_p90_ms": _pct(ok, 90),
                "timeouts": len(got) - len(ok),
                "split_p50_ms": {k: _pct([s[k] for s in splits if k in s], 50) for k in SPLIT},
            }
        server = srv.state.metrics().get("speech_end_to_first_audio_ms", {})
    finally:
        srv.stop()
    print(f"\nphone benchmark (Twilio Media Streams, μ-law 8 kHz): question {question.name}")
    cols = " | ".join(f"{name} p50" for name in SPLIT.values())
    print(f"| c | speech end → first media p50 ms | p90 | timeouts | {cols} |")
    print("|---|---|---|---|" + "---|" * len(SPLIT))
    for c, m in results.items():
        row = [m["first_media_p50_ms"], m["first_media_p90_ms"], m["timeouts"], *m["split_p50_ms"].values()]
        print(f"| {c} | " + " | ".join(f"{x:.0f}" for x in row) + " |")
    if server:
        print(f"server-side speech end → first audio, all calls: {json.dumps(server)}")
    if json_out:
        json_out.write_text(json.dumps(results, indent=2))
    return results


async def _level(url: str, q: np.ndarray, c: int, timeout: float) -> list[float | None]:
    return await asyncio.gather(*(_call(url, q, timeout) for _ in range(c)))
