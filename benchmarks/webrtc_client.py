"""A scripted WebRTC voice client (aiortc) for server tests: plays PCM as its microphone, records events.

Used by `bench soak` and the WebRTC e2e tests.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

RATE = 48000
FRAME = 960  # 20 ms


class ScriptedMic(MediaStreamTrack):
    """Plays ``pcm`` (float32, 48 kHz mono) in real time, then silence; :meth:`vanish` stops all output."""

    kind = "audio"

    def __init__(self, pcm: np.ndarray) -> None:
        super().__init__()
        self.pcm = (np.clip(pcm, -1, 1) * 32767).astype(np.int16)
        self.pos = 0
        self.t0: float | None = None
        self.stalled = asyncio.Event()

    def vanish(self) -> None:
        """Behave like a client whose machine dropped off the network: no more packets, no goodbye."""
        self.stalled.set()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.stalled.is_set():
            await asyncio.Future()  # never resolves
        if self.t0 is None:
            self.t0 = time.monotonic()
        n = self.pos // FRAME
        delay = self.t0 + n * 0.020 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        chunk = np.zeros(FRAME, np.int16)
        part = self.pcm[self.pos : self.pos + FRAME]
        chunk[: part.size] = part
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self.pos, fractions.Fraction(1, RATE)
        self.pos += FRAME
        return frame


class VoiceClient:
    """One peer: microphone track, ``events`` data channel, counts of received reply audio."""

    def __init__(self, pcm: np.ndarray) -> None:
        self.pc = RTCPeerConnection()
        self.mic = ScriptedMic(pcm)
        self.events: list[dict] = []
        self.audio_frames = 0
        self.nonzero_frames = 0
        self.session_id: str | None = None
        self._tasks: list[asyncio.Task] = []
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("events")
        self.channel.on("message", lambda m: self.events.append(json.loads(m)))
        self.pc.on("track", self._on_track)

    def _on_track(self, track) -> None:
        async def drain():
            try:
                while True:
                    f = await track.recv()
                    self.audio_frames += 1
                    self.nonzero_frames += bool(np.abs(f.to_ndarray()).max() > 0)
            except MediaStreamError:
                pass

        self._tasks.append(asyncio.ensure_future(drain()))

    async def offer(self) -> dict:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return {"sdp": self.pc.localDescription.sdp, "type": "offer"}

    async def accept(self, answer: dict) -> None:
        self.session_id = answer["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))

    def kinds(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def wait_for(self, kind: str, timeout: float, *or_kinds: str) -> dict:
        """The first event of ``kind`` or of one of ``or_kinds`` (waits up to ``timeout`` s, then raises
        TimeoutError)."""
        kinds = (kind, *or_kinds)
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e["type"] in kinds:
                    return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind!r} event after {timeout} s; got {self.kinds()}")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self.pc.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
