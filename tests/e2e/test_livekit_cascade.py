"""livekit-agents' AgentSession on the in-process plugin over the real cascade (`--model small`: Moonshine →
SmolLM2 → Piper, whose long replies give a barge-in something to cut; the default 0.5B declines to tell
stories), with in-memory room audio: a spoken question answered aloud, a text turn from
``generate_reply(instructions=...)``, and a barge-in whose truncation leaves the played words in history."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession  # noqa: E402
from livekit_io import RATE, MicInput, SpeakerOutput, speech  # noqa: E402

from omniduplex.app.surfaces.livekit.local_model import PipelineOptions, PipelineRealtimeModel  # noqa: E402
from omniduplex.app.surfaces.livekit.worker import show_thinking  # noqa: E402

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def until(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_cascade_in_process_spoken_turn_text_turn_and_barge_in():
    async def main():
        model = PipelineRealtimeModel(options=PipelineOptions(model="small", max_tokens=48))
        await model.start()
        session = AgentSession(llm=model, aec_warmup_duration=None)
        mic, speaker = MicInput(), SpeakerOutput()
        session.input.audio, session.output.audio = mic, speaker
        states, transcripts, errors, cuts = [], [], [], []
        session.on("agent_state_changed", lambda ev: states.append(ev.new_state))
        session.on("user_input_transcribed", lambda ev: ev.is_final and transcripts.append(ev.transcript))
        session.on("error", lambda ev: errors.append(ev.error))
        show_thinking(session)
        await session.start(Agent(instructions="You are a friendly voice assistant. Answer in English."))
        rt = next(iter(model.sessions))
        truncate = rt.truncate
        rt.truncate = lambda **kw: (cuts.append(kw), truncate(**kw))[1]

        # 1. a spoken question: our VAD ends the turn, Whisper transcribes it, the reply is heard
        mic.say(speech(EXAMPLES / "green_tea.wav"))
        await until(lambda: speaker.reports)
        # the agent goes back to listening once it has handled the playback report (its own task): wait for it
        await until(lambda: len(states) >= 4, timeout=10)
        spoken = (list(transcripts), speaker.audio().size / RATE, list(states))

        # 2. a text turn from generate_reply(instructions=...)
        await asyncio.wait_for(session.generate_reply(instructions="Greet the caller in one sentence."), 120)
        greeted = speaker.audio().size / RATE - spoken[1]

        # 3. a long reply, interrupted by speech after 1.5 s of playback
        handle = session.generate_reply(user_input="Tell me a long story about a brave cat.")
        await until(lambda: speaker.segments >= 3)  # the story is playing
        await asyncio.sleep(1.5)
        mic.say(speech(EXAMPLES / "green_tea.wav"))
        await asyncio.wait_for(handle, 60)
        await until(lambda: cuts and not rt._gens)
        story_turn = rt._turn_of[cuts[0]["message_id"]]
        record = rt.session.reply_record(story_turn)
        generated, kept = record.text, record.kept
        await session.aclose()
        await model.aclose()
        return spoken, greeted, cuts, generated, kept, errors

    (heard, spoken_s, states), greeted_s, cuts, generated, kept, errors = asyncio.run(main())
    assert any("green tea" in t.lower() for t in heard), heard
    assert spoken_s > 1.0 and greeted_s > 0.5  # reply audio reached the room's speaker
    assert states[:4] == ["listening", "thinking", "speaking", "listening"]
    (cut,) = cuts
    assert 200 <= cut["audio_end_ms"] <= 4000  # under 1.5 s when the CPU cannot keep up
    assert kept and generated.startswith(kept)  # exactly a prefix of the generated text, whitespace included
    assert len(kept) < len(generated.strip())  # the history holds the played part only
    assert not errors
