"""livekit-agents' AgentSession driving our in-process realtime plugin, with in-memory room audio
(no LiveKit server) and a scripted pipeline: text turns, a spoken turn with transcription, barge-in and
truncation to the played audio, the agent's states, and a participant leaving mid-reply. The real cascade
runs the same flows in tests/e2e/test_livekit_cascade.py."""

from __future__ import annotations

import asyncio
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession  # noqa: E402
from livekit.agents.types import ATTRIBUTE_AGENT_STATE  # noqa: E402
from livekit.agents.voice.events import CloseReason  # noqa: E402
from livekit.agents.voice.room_io.room_io import RoomIO  # noqa: E402
from livekit_io import RATE, MicInput, SpeakerOutput, speech  # noqa: E402
from livekit_scripted import CHUNK_S, WORDS, ScriptedPipeline  # noqa: E402

from omniduplex.app.core.history import truncate_aligned  # noqa: E402
from omniduplex.app.surfaces.livekit.local_model import PipelineRealtimeModel  # noqa: E402
from omniduplex.app.surfaces.livekit.worker import show_thinking  # noqa: E402

GREEN_TEA = Path(__file__).resolve().parents[1] / "examples" / "green_tea.wav"


class LocalParticipant:
    """Stands in for the agent's ``rtc.LocalParticipant``: records attribute updates."""

    def __init__(self) -> None:
        self.attributes: list[dict] = []

    async def set_attributes(self, attributes: dict) -> None:
        self.attributes.append(dict(attributes))


def room_io_stub():
    """Just enough of RoomIO for its agent-state handler: a connected room and its local participant."""
    room = types.SimpleNamespace(local_participant=LocalParticipant(), isconnected=lambda: True)
    return types.SimpleNamespace(_room=room, _update_state_atask=None)


class Room:
    """An AgentSession on the plugin, its in-memory audio, and what the framework reported."""

    def __init__(self, pipeline: ScriptedPipeline, transcription: bool = True) -> None:
        self.pipeline = pipeline
        self.model = PipelineRealtimeModel(responder=pipeline, user_transcription=transcription)
        self.session = AgentSession(llm=self.model, aec_warmup_duration=None)
        self.mic, self.speaker = MicInput(), SpeakerOutput()
        self.session.input.audio, self.session.output.audio = self.mic, self.speaker
        self.states: list[str] = []
        self.transcripts: list[tuple[str, bool]] = []
        self.errors: list = []
        self.truncations: list[dict] = []
        self.session.on("agent_state_changed", lambda ev: self.states.append(ev.new_state))
        self.session.on(
            "user_input_transcribed", lambda ev: self.transcripts.append((ev.transcript, ev.is_final))
        )
        self.session.on("error", lambda ev: self.errors.append(ev.error))
        show_thinking(self.session)
        # what RoomIO does with each state: the room's lk.agent.state participant attribute
        self.room_io = room_io_stub()
        self.session.on("agent_state_changed", lambda ev: RoomIO._on_agent_state_changed(self.room_io, ev))

    async def start(self, instructions: str = "You count.") -> None:
        await self.model.start()
        await self.session.start(Agent(instructions=instructions))
        self.rt = next(iter(self.model.sessions))
        truncate = self.rt.truncate

        def spy(**kw):
            self.truncations.append(kw)
            truncate(**kw)

        self.rt.truncate = spy

    async def until(self, predicate, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)


def test_text_turns_via_generate_reply_reach_the_speaker_and_the_history():
    async def main():
        room = Room(ScriptedPipeline())
        await room.start("You count.")
        handle = room.session.generate_reply(instructions="Count to eight.")
        await asyncio.wait_for(handle, 30)
        first = room.pipeline.started[-1]
        handle = room.session.generate_reply(user_input="Again, please.")
        await asyncio.wait_for(handle, 30)
        second = room.pipeline.started[-1]
        history = [[role, text.strip()] for role, text in room.rt.session.history.entries]
        await room.session.aclose()
        return room, first, second, history

    room, first, second, history = asyncio.run(main())
    text = " ".join(WORDS)
    # instructions: the agent's become the session's system prompt, generate_reply's add to one reply
    assert first[2]["system_prompt"] == "You count." and first[2]["instructions"] == "Count to eight."
    # a user message from the framework reaches the pipeline as the turn's text (update_chat_ctx)
    assert second[2]["user_text"] == "Again, please." and second[1] == [["assistant", text]]
    assert "instructions" not in second[2]
    assert history == [["assistant", text], ["user", "Again, please."], ["assistant", text]]
    # every sample of both replies was played, and completed (not interrupted)
    assert room.speaker.reports == [(pytest.approx(len(WORDS) * CHUNK_S, abs=0.01), False)] * 2
    assert room.speaker.audio().size == pytest.approx(2 * len(WORDS) * CHUNK_S * RATE, abs=2)
    messages = [(m.role, m.text_content.strip()) for m in room.session.history.messages()]
    assert messages == [("assistant", text), ("user", "Again, please."), ("assistant", text)]
    assert room.states[:4] == ["listening", "thinking", "speaking", "listening"]
    attributes = [a[ATTRIBUTE_AGENT_STATE] for a in room.room_io._room.local_participant.attributes]
    # (RoomIO drops an update superseded before it was sent, as the first "listening" here)
    assert ATTRIBUTE_AGENT_STATE == "lk.agent.state"
    assert attributes[:3] == ["thinking", "speaking", "listening"] and attributes[-1] == "listening"
    assert not room.errors


def test_spoken_turn_then_barge_in_truncates_the_history_to_the_played_audio():
    async def main():
        room = Room(ScriptedPipeline(transcript="count to eight"))
        await room.start()
        room.mic.say(speech(GREEN_TEA))  # a spoken turn: our VAD commits it and the reply starts itself
        await room.until(lambda: room.session.agent_state == "speaking")
        await room.until(lambda: room.speaker.position() >= 1.3)  # 1.3 s of the 4 s reply played...
        talk_at = room.speaker.position()
        room.mic.say(speech(GREEN_TEA))  # ... then the user talks over it
        await room.until(lambda: room.truncations and len(room.pipeline.started) >= 2)
        await room.until(lambda: room.session.agent_state == "listening" and len(room.speaker.reports) >= 2)
        first_history = room.pipeline.started[1][1]
        await room.session.aclose()
        return room, first_history, talk_at

    room, second_turn_history, talk_at = asyncio.run(main())
    first_turn = room.pipeline.started[0][0]
    assert room.transcripts[-1] == ("count to eight", True)  # our ASR's transcript, final
    # the framework interrupted playback and told the model what was played
    (cut,) = room.truncations
    assert cut["message_id"] == f"{first_turn}-reply" and "audio" in cut["modalities"]
    position, interrupted = room.speaker.reports[0]
    assert interrupted and cut["audio_end_ms"] == int(position * 1000)
    # played past the point where the user started talking, and stopped before the reply's end
    assert 1000 * talk_at <= cut["audio_end_ms"] < 1000 * len(WORDS) * CHUNK_S
    # our history keeps exactly the words of the audio that was played (the TTS chunks' alignment)
    chunk = int(CHUNK_S * RATE)
    chunks = [(chunk * (i + 1), w) for i, w in enumerate(WORDS)]
    kept = truncate_aligned(chunks, round(cut["audio_end_ms"] * RATE / 1000), "".join(f"{w} " for w in WORDS))
    assert kept and kept != " ".join(WORDS)
    assert second_turn_history[:2] == [["user", "count to eight"], ["assistant", kept]]
    # the interruption cancelled the pipeline turn, and the user's speech became the next turn
    assert first_turn in room.pipeline.cancelled
    assert "speaking" in room.states and room.states[-1] == "listening"
    assert not room.errors


def test_participant_leaving_mid_reply_cancels_the_turn():
    async def main():
        room = Room(ScriptedPipeline(step_s=0.3))
        await room.start()
        room.session.generate_reply(instructions="Count slowly.")
        await room.until(lambda: room.session.agent_state == "speaking")
        closed = asyncio.Event()
        room.session.on("close", lambda ev: closed.set())
        # what RoomIO does when the linked participant disconnects
        room.session._close_soon(reason=CloseReason.PARTICIPANT_DISCONNECTED)
        await asyncio.wait_for(closed.wait(), 10)
        return room

    room = asyncio.run(main())
    (turn_id, _, _) = room.pipeline.started[0]
    assert turn_id in room.pipeline.cancelled
    assert room.rt.session.closed and room.rt.session.reply_turn_id is None
    assert not room.rt._gens  # every stream handed to the framework was ended
