"""Barge-in through the remote plugin (``app/surfaces/livekit/remote*.py``) against ``/v1/realtime`` on a
scripted pipeline: the reply is one 0.92 s clause, then nothing for a long while (a slow next clause). The
user speaks (real speech, the server's VAD) either while the clause plays or after the room has played all of
it. Either way the server cancels the response itself (``turn_detected``), the plugin sends no
``response.cancel`` of its own and no ``error`` comes back, and the server's history keeps the clause's words
cut to what the room played. While the clause plays the room's playback is interrupted; once it has all
played, the playback reports it whole or interrupted at its end, both true of what the room heard (the
contract in :mod:`omniduplex.app.surfaces.livekit.remote`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession  # noqa: E402
from livekit_io import RATE, MicInput, SpeakerOutput, speech  # noqa: E402

from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta  # noqa: E402
from omniduplex.app.server import ServerConfig, create_app  # noqa: E402
from omniduplex.app.surfaces.livekit.remote import RemoteOptions, RemoteRealtimeModel  # noqa: E402
from omniduplex.benchmarks.local_server import LocalServer  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLAUSE, CLAUSE_S = "There's a cat.", 0.92


class SlowSecondClause:
    """Every reply: :data:`CLAUSE` (0.92 s of tone), then a next clause that takes 60 s to come."""

    output_rate = RATE

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue] = {}

    def start(self, turn_id, waveform, history, options=None):
        q = self.queues[turn_id] = asyncio.Queue()
        asyncio.get_running_loop().create_task(self._speak(q))

    async def _speak(self, q: asyncio.Queue) -> None:
        t = np.arange(int(CLAUSE_S * RATE)) / RATE
        q.put_nowait(ReplyTextDelta(CLAUSE))
        q.put_nowait(ReplyAudioChunk((0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), CLAUSE))
        await asyncio.sleep(60)
        q.put_nowait(ReplyDone())

    async def events(self, turn_id):
        q = self.queues[turn_id]
        while (ev := await q.get()) is not None:
            yield ev
            if isinstance(ev, ReplyDone | ReplyFailed):
                return

    def cancel(self, turn_id):
        self.queues[turn_id].put_nowait(ReplyFailed("cancelled"))


@pytest.fixture(scope="module")
def server():
    with LocalServer(create_app(ServerConfig(max_sessions=4), responder=SlowSecondClause())) as srv:
        yield srv


async def until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("when", ["while the clause plays", "after it has all played"])
def test_barge_in_cancels_on_the_server_and_the_room_keeps_what_it_heard(server, when):
    async def main():
        opts = RemoteOptions(url=server.url("/v1/realtime", "ws"), user_transcription=False)
        model = RemoteRealtimeModel(opts)
        session = AgentSession(llm=model, aec_warmup_duration=None)
        mic, speaker = MicInput(), SpeakerOutput()
        session.input.audio, session.output.audio = mic, speaker
        errors: list = []
        session.on("error", lambda ev: errors.append(ev.error))
        await session.start(Agent(instructions="Tell stories."))
        rt = next(iter(model.sessions))
        await until(lambda: rt.link.connected)
        (call,) = server.state.sessions.values()  # the server side of this connection
        sent, received = [], []
        send, on_event = rt.link.send, rt.link.on_event
        rt.link.send = lambda e: sent.append(e.type) or send(e)
        rt.link.on_event = lambda e: received.append(e) or on_event(e)

        def interrupted() -> bool:
            return bool(speaker.reports) and speaker.reports[0][1]

        handle = session.generate_reply(user_input="Tell me a story.")
        await until(lambda: speaker.segments == 1)  # the clause started playing
        if when == "while the clause plays":
            mic.say(speech(EXAMPLES / "green_tea.wav", lead_s=0.0))
        else:
            await until(lambda: speaker.position() >= CLAUSE_S)  # the room has played all it was sent
            mic.say(speech(EXAMPLES / "green_tea.wav", lead_s=0.0))
        await asyncio.wait_for(handle, 30)
        await until(lambda: speaker.reports and rt._gen is None and not rt._after_response)
        def truncated() -> bool:  # an interrupted playback's truncate has reached the server
            return any(e.type == "conversation.item.truncated" for e in received)

        await until(lambda: truncated() or not interrupted())
        done = [e for e in received if e.type == "response.done"]
        history = [list(e) for e in call.session.history.entries]
        await session.aclose()
        return speaker.reports[0], done, sent, received, history, errors

    (position, interrupted), done, sent, received, history, errors = asyncio.run(main())
    (response,) = [e.response for e in done]
    assert response.status == "cancelled" and response.status_details.reason == "turn_detected"
    assert "response.cancel" not in sent and not [e for e in received if e.type == "error"] and not errors
    assert history[0] == ["user", "Tell me a story."]
    kept = [text for role, text in history if role == "assistant"]  # "" is not kept: the entry goes
    if when == "while the clause plays":
        assert interrupted and position < CLAUSE_S - 0.1, (position, interrupted)
        assert all(CLAUSE.startswith(t) and t != CLAUSE for t in kept), kept  # a prefix of what was said
    else:
        assert position == pytest.approx(CLAUSE_S, abs=0.03), (position, interrupted)
        assert kept == [CLAUSE], kept
