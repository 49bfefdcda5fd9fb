"""A kiosk server whose replies are scripted: fast, deterministic browser tests of ``/kiosk`` and ``/``.

:class:`ScriptedReplies` answers every spoken turn with :data:`USER_WORDS` as the user's transcript, the
whole reply text at once (generation runs ahead of the audio, as in the real pipeline), then, after
``think_s``, one audio chunk per clause of :data:`REPLY_CLAUSES`, each carrying its words
(``ReplyAudioChunk(pcm, text)``) so the session emits ``reply_spoken`` captions in step with playback.
A greeting turn (typed, with instructions quoting the greeting) is answered with the quoted greeting.

Not a test module. Run as a script to serve on a port (the restart test kills and restarts it)::

    python tests/e2e/_kiosk_server.py PORT [--max-sessions N]
"""

from __future__ import annotations

import argparse
import asyncio
import re

import numpy as np

from omniduplex.app.core.replies import (
    ReplyAudioChunk,
    ReplyDone,
    ReplyFailed,
    ReplyTextDelta,
    UserTranscript,
)
from omniduplex.app.host.auth import AuthConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.kiosk.config import KioskConfig

RATE = 24000
"""Reply audio rate (Hz)."""
USER_WORDS = "What can I see in the museum today?"
REPLY_CLAUSES = [
    "Today you can visit the dinosaur hall, ",
    "the space gallery, ",
    "and the new ocean exhibit.",
]
GREETING = "Welcome to the museum! Ask me about anything you see."
TITLE = "Ask the museum"


def voice(seconds: float, seed: int = 0) -> np.ndarray:
    """A speech-like test signal: a 140 Hz buzz with harmonics, 4 syllables per second (float32, RATE)."""
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 140.0 * (1.0 + 0.05 * np.sin(2 * np.pi * 0.7 * t + seed))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    buzz = sum(np.sin(k * phase) / k for k in (1, 2, 3, 4))
    syllables = 0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t) ** 2
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)
    return (0.25 * buzz * syllables * fade).astype(np.float32)


class ScriptedReplies:
    """A :class:`~omniduplex.app.core.replies.Responder` with a known reply (see the module docstring).

    ``think_s``: commit → first audio chunk (s), so "thinking" is visible; ``clause_s``: audio per clause (s).
    ``started``: ``(turn_id, audio_s, options)`` of every turn, for in-process tests.
    """

    output_rate = RATE

    def __init__(self, think_s: float = 1.2, clause_s: float = 1.5) -> None:
        self.think_s, self.clause_s = think_s, clause_s
        self.queues: dict[str, asyncio.Queue] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.started: list[tuple[str, float, dict]] = []

    def start(self, turn_id, waveform, history, options=None) -> None:
        options = options or {}
        self.started.append((turn_id, waveform.size / 16000, options))
        q = self.queues[turn_id] = asyncio.Queue()
        self.tasks[turn_id] = asyncio.get_running_loop().create_task(
            self._play(q, waveform.size > 0, options)
        )

    async def _play(self, q: asyncio.Queue, spoken: bool, options: dict) -> None:
        quoted = re.search(r'"([^"]+)"', options.get("instructions") or "")
        if spoken:
            q.put_nowait(UserTranscript(USER_WORDS, [[w, 0.0, 0.0] for w in USER_WORDS.split()]))
            clauses = REPLY_CLAUSES
        elif quoted:
            clauses = [c + " " for c in re.split(r"(?<=[!?.])\s+", quoted.group(1))]
        else:
            clauses = ["Hello! How can I help? "]
        await asyncio.sleep(0.1)
        for word in "".join(clauses).split(" "):
            q.put_nowait(ReplyTextDelta(word + " "))
        await asyncio.sleep(self.think_s)
        for i, clause in enumerate(clauses):
            q.put_nowait(ReplyAudioChunk(voice(self.clause_s, seed=i), clause))
        q.put_nowait(ReplyDone({}))

    async def events(self, turn_id):
        q = self.queues[turn_id]
        try:
            while True:
                ev = await q.get()
                yield ev
                if isinstance(ev, ReplyDone | ReplyFailed):
                    return
        finally:
            self.queues.pop(turn_id, None)
            self.tasks.pop(turn_id, None)

    def cancel(self, turn_id) -> None:
        task, q = self.tasks.get(turn_id), self.queues.get(turn_id)
        if task is None or q is None:
            return
        task.cancel()
        q.put_nowait(ReplyFailed("cancelled"))


def kiosk_app(max_sessions: int = 8, media_timeout_s: float = 3.0, api_keys: tuple[str, ...] = ()):
    """``create_app`` with the scripted replies and a museum kiosk config (``api_keys``: required keys, none
    by default); returns ``(app, responder)``."""
    responder = ScriptedReplies()
    cfg = ServerConfig(
        max_sessions=max_sessions,
        media_timeout_s=media_timeout_s,
        kiosk=KioskConfig(title=TITLE, greeting=GREETING, idle_timeout_s=60, attract_after_s=30),
        auth=AuthConfig(api_keys=set(api_keys)),
    )
    return create_app(cfg, responder=responder), responder


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("port", type=int)
    ap.add_argument("--max-sessions", type=int, default=8)
    args = ap.parse_args()
    app, _ = kiosk_app(args.max_sessions)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
