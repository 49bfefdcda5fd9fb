"""A pipeline stand-in for the LiveKit plugin tests: every turn gets the same spoken reply, one word per
0.5 s audio chunk (each chunk carries its word, as the cascade's TTS chunks carry their clause), and an
optional user transcript first."""

from __future__ import annotations

import asyncio

import numpy as np

from omniduplex.app.core.replies import (
    ReplyAudioChunk,
    ReplyDone,
    ReplyFailed,
    ReplyTextDelta,
    UserTranscript,
)

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
CHUNK_S = 0.5


class ScriptedPipeline:
    """A :class:`~omniduplex.app.core.replies.Responder`; records starts (``started``) and cancels."""

    output_rate = 24000

    def __init__(self, transcript: str | None = None, words: list[str] | None = None, step_s: float = 0.05):
        self.transcript, self.words, self.step_s = transcript, words or WORDS, step_s
        self.started: list[tuple[str, list, dict]] = []  # (turn id, history, options)
        self.cancelled: list[str] = []
        self.queues: dict[str, asyncio.Queue] = {}

    def start(self, turn_id, waveform, history, options=None):
        self.started.append((turn_id, history, options or {}))
        q = self.queues[turn_id] = asyncio.Queue()
        if self.transcript is not None and waveform.size:
            q.put_nowait(UserTranscript(self.transcript))
        asyncio.get_running_loop().create_task(self._speak(q))

    async def _speak(self, q: asyncio.Queue) -> None:
        tone = (0.1 * np.sin(np.arange(int(CHUNK_S * self.output_rate)) * 0.05)).astype(np.float32)
        for w in self.words:
            await asyncio.sleep(self.step_s)
            q.put_nowait(ReplyTextDelta(w + " "))
            q.put_nowait(ReplyAudioChunk(tone, w + " "))
        q.put_nowait(ReplyDone({}))

    async def events(self, turn_id):
        q = self.queues[turn_id]
        while True:
            ev = await q.get()
            yield ev
            if isinstance(ev, ReplyDone | ReplyFailed):
                return

    def cancel(self, turn_id):
        if turn_id not in self.cancelled:
            self.cancelled.append(turn_id)
            self.queues[turn_id].put_nowait(ReplyFailed("cancelled"))
