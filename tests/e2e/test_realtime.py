"""The Realtime API (GA) through the official ``openai`` SDK's realtime client against ``omniduplex serve`` on
the default cascade (stage processes): spoken turns under server VAD, manual commit, text turns, barge-in and
truncate, cancel, a format switch to μ-law, bad input, and 16 concurrent sessions."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import numpy as np
import pytest
import soxr
from openai import AsyncOpenAI

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.pipeline.audio_io import load_audio

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHUNK = 480  # 20 ms at 24 kHz


@pytest.fixture(scope="module")
def server():
    """``omniduplex serve`` (default cascade, stage processes) on a free loopback port."""
    with LocalServer(create_app(ServerConfig(max_sessions=20, processes=True, max_tokens=24))) as srv:
        yield srv.url("/v1"), srv.state


def pcm24(path: Path, tail_s: float = 1.2) -> bytes:
    """A speech file as PCM16 mono 24 kHz, with ``tail_s`` of silence (so the server VAD ends the turn)."""
    x = soxr.resample(load_audio(path), 16000, 24000).astype(np.float32)
    x = np.concatenate([np.zeros(4800, np.float32), x, np.zeros(int(24000 * tail_s), np.float32)])
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def stream(conn, pcm: bytes, realtime: bool = True) -> None:
    """Append ``pcm`` in 20 ms pieces, paced in real time like a microphone."""
    for i in range(0, len(pcm), 2 * CHUNK):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 2 * CHUNK]).decode())
        if realtime:
            await asyncio.sleep(0.02)


async def until(conn, kind: str, timeout: float = 90.0, events: list | None = None) -> list:
    """Events up to and including the first of type ``kind``."""
    events = [] if events is None else events
    async with asyncio.timeout(timeout):
        async for e in conn:
            events.append(e)
            if e.type == kind:
                return events
    raise AssertionError(f"connection closed before {kind}")


def audio_s(events: list) -> float:
    """Seconds of PCM16 24 kHz audio in the ``response.output_audio.delta`` events of ``events``."""
    deltas = [e.delta for e in events if e.type == "response.output_audio.delta"]
    return sum(len(base64.b64decode(d)) for d in deltas) / (2 * 24000)


def client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="sk-local", max_retries=0)


RESPONSE_ORDER = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def check_response_order(types: list[str]) -> None:
    """The documented order of one audio response, event by event; deltas only between the content part's
    ``added`` and the audio ``done``."""
    # the input transcription is asynchronous: it may arrive anywhere after the commit, as in the API
    types = [t for t in types if not t.startswith("conversation.item.input_audio_transcription")]
    skeleton = [t for t in types if not t.endswith(".delta")]
    start = skeleton.index("response.created")
    assert skeleton[start:] == RESPONSE_ORDER, skeleton
    first_delta = min(i for i, t in enumerate(types) if t.endswith(".delta"))
    last_delta = max(i for i, t in enumerate(types) if t.endswith(".delta"))
    assert types.index("response.content_part.added") < first_delta
    assert last_delta < types.index("response.output_audio.done")


def test_spoken_turn_under_server_vad_in_the_documented_order(server):
    url, _ = server

    async def main():
        async with client(url).realtime.connect(model="omniduplex") as conn:
            created = await until(conn, "session.created")
            await conn.session.update(
                session={"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
            )
            await until(conn, "session.updated")
            sender = asyncio.create_task(stream(conn, pcm24(EXAMPLES / "green_tea.wav")))
            events = await until(conn, "response.done")
            events = (
                await until(conn, "conversation.item.input_audio_transcription.completed", 30, events)
                if not any(e.type == "conversation.item.input_audio_transcription.completed" for e in events)
                else events
            )
            await sender
            return created, events

    created, events = asyncio.run(main())
    assert created[-1].session.type == "realtime"
    types = [e.type for e in events]
    # the user's turn: VAD, commit, its item; then the response in order
    user = [t for t in types if t.startswith("input_audio_buffer") or t == "conversation.item.done"][:4]
    assert user == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.done",
    ]
    check_response_order(types)
    done = next(e for e in events if e.type == "response.done")
    assert done.response.status == "completed" and done.response.usage.output_tokens > 0
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert len(audio) > 2 * 24000  # over a second of 24 kHz PCM16
    transcript = next(e for e in events if e.type == "response.output_audio_transcript.done").transcript
    assert len(transcript.split()) >= 3
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert "green tea" in heard.transcript.lower()


def test_manual_commit_with_instructions_and_metadata(server):
    url, _ = server

    async def main():
        async with client(url).realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created")
            await conn.session.update(
                session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
            )
            await until(conn, "session.updated")
            await stream(conn, pcm24(EXAMPLES / "green_tea.wav", tail_s=0.2), realtime=False)
            await conn.input_audio_buffer.commit()
            events = await until(conn, "conversation.item.done")
            assert not any(e.type.startswith("response.") for e in events)  # no response until asked
            await conn.response.create(
                response={
                    "instructions": "Start your answer with the word Sure.",
                    "metadata": {"topic": "tea"},
                }
            )
            return events + await until(conn, "response.done")

    events = asyncio.run(main())
    types = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in types  # no VAD with turn_detection null
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    created = next(e for e in events if e.type == "response.created")
    assert created.response.metadata == {"topic": "tea"}
    done = next(e for e in events if e.type == "response.done")
    assert done.response.status == "completed" and done.response.metadata == {"topic": "tea"}
    check_response_order(types)


def test_text_turn_gets_a_spoken_reply_and_cancel_stops_it(server):
    url, _ = server

    async def main():
        async with client(url).realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Say hello."}],
                }
            )
            added = await until(conn, "conversation.item.done")
            await conn.response.create()
            first = await until(conn, "response.done")
            # a long reply, cancelled after its first audio
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Tell me a long story about a brave cat."}],
                }
            )
            await conn.response.create()
            early = await until(conn, "response.output_audio.delta")
            await conn.response.cancel()
            rest = await until(conn, "response.done")
            return added, first, early, rest

    added, first, early, rest = asyncio.run(main())
    assert added[-1].item.role == "user" and added[-1].item.content[0].text == "Say hello."
    assert any(e.type == "response.output_audio.delta" for e in first)
    assert next(e for e in first if e.type == "response.done").response.status == "completed"
    done = rest[-1]
    assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
    # audio stops at once: at most a few 20 ms frames were in flight when the cancel arrived
    assert sum(e.type == "response.output_audio.delta" for e in rest) <= 5


def test_barge_in_cancels_the_response_then_truncate(server):
    url, state = server

    async def main():
        async with client(url).realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Tell me a long story about a brave cat."}],
                }
            )
            await conn.response.create()
            events = await until(conn, "response.output_audio.delta")
            item_id = next(e for e in events if e.type == "response.output_item.added").item.id
            while audio_s(events) < 0.5:  # some reply audio plays (deltas come as the server plays them)
                await until(conn, "response.output_audio.delta", events=events)
            sender = asyncio.create_task(stream(conn, pcm24(EXAMPLES / "green_tea.wav")))
            barge = await until(conn, "response.done")
            await sender
            await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=300)
            truncated = await until(conn, "conversation.item.truncated")
            await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=10**7)
            err = await until(conn, "error")
            return barge, truncated, err

    barge, truncated, err = asyncio.run(main())
    types = [e.type for e in barge]
    started = types.index("input_audio_buffer.speech_started")
    done = barge[-1]
    assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    assert sum(t == "response.output_audio.delta" for t in types[started:]) <= 3  # deltas stop at once
    assert truncated[-1].audio_end_ms == 300
    assert err[-1].error.param == "audio_end_ms"


def test_session_update_to_pcmu_and_bad_input_get_errors_and_the_session_goes_on(server):
    url, _ = server

    async def main():
        async with client(url).realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created")
            await conn.send_raw("{not json")
            e1 = await until(conn, "error")
            await conn.send_raw(json.dumps({"type": "no.such.event", "event_id": "ev_unknown"}))
            e2 = await until(conn, "error")
            await conn.send_raw(
                json.dumps({"type": "input_audio_buffer.append", "event_id": "ev_b64", "audio": "%%%"})
            )
            e3 = await until(conn, "error")
            await conn.session.update(
                session={
                    "type": "realtime",
                    "instructions": "You are terse.",
                    "audio": {
                        "input": {"format": {"type": "audio/pcmu"}},
                        "output": {"format": {"type": "audio/pcmu"}},
                    },
                }
            )
            upd = await until(conn, "session.updated")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Say hi."}],
                }
            )
            await conn.response.create()
            await until(conn, "response.created")
            await conn.send_raw(json.dumps({"type": "response.create", "event_id": "ev_busy"}))
            busy = await until(conn, "error")
            rest = await until(conn, "response.done")
            return e1, e2, e3, upd, busy, rest

    e1, e2, e3, upd, busy, rest = asyncio.run(main())
    assert e1[-1].error.code == "invalid_json"
    assert e2[-1].error.event_id == "ev_unknown"
    assert e3[-1].error.event_id == "ev_b64"
    assert (
        upd[-1].session.audio.output.format.type == "audio/pcmu"
        and upd[-1].session.instructions == "You are terse."
    )
    assert (
        busy[-1].error.event_id == "ev_busy"
        and busy[-1].error.code == "conversation_already_has_active_response"
    )
    mulaw = b"".join(base64.b64decode(e.delta) for e in rest if e.type == "response.output_audio.delta")
    assert len(mulaw) > 8000 // 2  # over half a second of 8 kHz μ-law (1 byte per sample)
    assert rest[-1].response.status == "completed"


def test_sixteen_concurrent_sessions(server):
    url, state = server

    async def one(i: int):
        async with client(url).realtime.connect(model="omniduplex") as conn:
            await until(conn, "session.created", 60)
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"Say the number {i}."}],
                }
            )
            await conn.response.create(response={"metadata": {"i": str(i)}})
            events = await until(conn, "response.done", 240)
            return events[-1].response

    async def main():
        return await asyncio.gather(*(one(i) for i in range(16)))

    responses = asyncio.run(main())
    assert [r.metadata["i"] for r in responses] == [str(i) for i in range(16)]
    assert all(r.status == "completed" for r in responses)
    deadline = time.monotonic() + 10
    while state.sessions and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not state.sessions  # every connection's slot was released
