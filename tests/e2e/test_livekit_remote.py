"""The remote plugin against a running ``omniduplex serve`` (default cascade, uvicorn on a loopback port, as
tests/e2e/test_realtime.py runs it): an AgentSession whose model is the server's ``/v1/realtime``, with
in-memory room audio. A spoken question is transcribed by the server's ASR and answered aloud; speech over
the next reply interrupts it, and the server's history keeps only what the room played. How fast the
story's clauses come does not matter: the barge-in may land while one plays or in the gap before the next
(the barge-in contract in app/surfaces/livekit/remote.py; tests/test_livekit_remote_barge_in.py pins both)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession  # noqa: E402
from livekit_io import RATE, MicInput, SpeakerOutput, speech  # noqa: E402

from omniduplex.app.server import ServerConfig, create_app  # noqa: E402
from omniduplex.app.surfaces.livekit.remote import RemoteOptions, RemoteRealtimeModel  # noqa: E402
from omniduplex.benchmarks.local_server import LocalServer

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def server():
    """``omniduplex serve`` (default cascade, stages in-process) on a free loopback port."""
    with LocalServer(create_app(ServerConfig(processes=False, max_tokens=48))) as srv:
        yield srv.url("/v1/realtime", "ws"), srv.state


async def until(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_remote_session_spoken_turn_and_barge_in(server):
    url, state = server

    async def main():
        model = RemoteRealtimeModel(RemoteOptions(url=url))
        session = AgentSession(llm=model, aec_warmup_duration=None)
        mic, speaker = MicInput(), SpeakerOutput()
        session.input.audio, session.output.audio = mic, speaker
        transcripts, errors = [], []
        session.on("user_input_transcribed", lambda ev: ev.is_final and transcripts.append(ev.transcript))
        session.on("error", lambda ev: errors.append(ev.error))
        await session.start(Agent(instructions="You are a friendly voice assistant. Answer in English."))
        rt = next(iter(model.sessions))
        await until(lambda: rt.link.connected, 30)
        (call,) = state.sessions.values()  # the server side of this connection

        mic.say(speech(EXAMPLES / "green_tea.wav"))
        await until(lambda: speaker.reports)
        answered_s = speaker.audio().size / RATE

        handle = session.generate_reply(user_input="Tell me a long story about a brave cat.")
        await until(lambda: speaker.segments == 2)  # the story is playing
        await asyncio.sleep(0.5)  # barge in early: a short reply (the LLM decides its length) still plays
        mic.say(speech(EXAMPLES / "green_tea.wav"))
        await asyncio.wait_for(handle, 60)
        await until(lambda: len(speaker.reports) >= 2 and not rt._after_response and rt._gen is None, 60)
        await asyncio.sleep(0.5)  # the truncate reaches the server
        position, interrupted = speaker.reports[1]
        server_history = [list(e) for e in call.session.history.entries]
        barge_ins = call.session.stats.barge_ins
        await session.aclose()
        return transcripts, answered_s, position, interrupted, server_history, errors, barge_ins

    transcripts, answered_s, position, interrupted, server_history, errors, barge_ins = asyncio.run(main())
    assert any("green tea" in t.lower() for t in transcripts), transcripts
    assert answered_s > 1.0
    assert barge_ins >= 1  # the server stopped the story when the user spoke over it
    # the room's playback stopped within the story: interrupted ~1.4 s in (0.5 s + VAD onset), or, when the
    # room had already played all the story's audio the server had sent (its next clause slow to come),
    # complete at the end of that audio: both are what the room heard
    assert 0.2 <= position <= 4.0, (position, interrupted, server_history)
    # the server's history has the story cut to the words of the ~position s the room played
    asked = server_history.index(["user", "Tell me a long story about a brave cat."])
    role, kept = server_history[asked + 1]
    assert role == "assistant" and 0 < len(kept.split()) <= 4 * position + 4, (kept, position)
    assert not errors
