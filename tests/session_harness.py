"""The session harness of the turn-taking tests (``test_session*``, ``test_preemptive``, ``test_kiosk``): a
scripted responder stands in for the pipeline and a loud/quiet VAD for webrtcvad; a fake clock advances
20 ms per frame and the test pulls one 20 ms output frame per input frame, as the WebRTC transport does.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from omniduplex.app.core.replies import ReplyDone, ReplyFailed
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.vad import TurnConfig

OUT_RATE = 48000
OUT_FRAME = 960  # 20 ms at 48 kHz
LOUD = np.full(320, 8000, np.int16)
QUIET = np.zeros(320, np.int16)


class LoudVad:
    """Speech = any sample above 1000 in magnitude."""

    def is_speech(self, frame: np.ndarray) -> bool:
        return bool(np.abs(frame.astype(np.int32)).max() > 1000)


class ScriptedResponder:
    """Replies are fed by the test through ``feed``; ``cancel`` ends the stream with ReplyFailed."""

    output_rate = 24000

    def __init__(self) -> None:
        self.started: list[tuple[str, np.ndarray, list]] = []
        self.cancelled: list[str] = []
        self.queues: dict[str, asyncio.Queue] = {}
        self.finished: set[str] = set()
        self.options: dict[str, dict] = {}

    def start(self, turn_id, waveform, history, options=None):
        self.started.append((turn_id, waveform, history))
        self.options[turn_id] = options or {}
        self.queues[turn_id] = asyncio.Queue()

    async def events(self, turn_id):
        q = self.queues[turn_id]
        while True:
            ev = await q.get()
            yield ev
            if isinstance(ev, ReplyDone | ReplyFailed):
                self.finished.add(turn_id)
                return

    def cancel(self, turn_id):
        if turn_id in self.finished or turn_id in self.cancelled:
            return
        self.cancelled.append(turn_id)
        self.queues[turn_id].put_nowait(ReplyFailed("cancelled"))

    def feed(self, turn_id, *events):
        for ev in events:
            self.queues[turn_id].put_nowait(ev)


class Harness:
    """Drives a session frame by frame on a fake clock; records events and output audio. Preemptive
    generation is off unless ``preemptive_ms`` is given (tests of it: test_preemptive.py), so that each
    test here sees only the replies of committed turns."""

    def __init__(self, turn: TurnConfig | None = None, preemptive_ms: int = 0) -> None:
        self.t = 100.0
        self.events = []
        self.responder = ScriptedResponder()
        turn = dataclasses.replace(turn or TurnConfig(), preemptive_ms=preemptive_ms)
        cfg = SessionConfig(turn=turn, output_rate=OUT_RATE)
        self.session = Session("s", self.responder, self.events.append, cfg, LoudVad(), lambda: self.t)
        self.out: list[np.ndarray] = []

    async def frames(self, frame: np.ndarray, n: int) -> None:
        """``n`` input frames (20 ms each), pulling one output frame after each."""
        for _ in range(n):
            self.t += 0.020
            self.session.push_audio(frame)
            self.out.append(self.session.pull_audio(OUT_FRAME)[0])
            await asyncio.sleep(0)  # let the reply task move events into the playout buffer

    def of(self, kind):
        return [e for e in self.events if isinstance(e, kind)]


def tone(seconds: float, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def run(coro):
    return asyncio.run(coro)
