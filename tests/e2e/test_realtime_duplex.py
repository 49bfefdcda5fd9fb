"""``ws /v1/realtime?duplex=1`` against ``omniduplex serve --model tiny --duplex-model DIR`` (a moshi-tiny
folder written by ``init-model``) started as a subprocess with a scrubbed environment (no ``OMNIDUPLEX_*``):
two duplex sessions at once both get continuous audio and transcript deltas, ``playback.ack`` trims the
history to what was played, a client that vanishes frees its engine row (after the 3 s resume grace period)
while the other keeps streaming, a dropped session resumes by id on a new socket (``session.resume``), a
``session.update`` with voice / role prompts restarts the session behind a silent prefill (bad prompts get
one clear error), a full engine is refused with "try again later", and the cascade Realtime endpoint
(official ``openai`` SDK) answers beside it. The duplex events are driven with plain ``websockets`` (the SDK
knows no ``playback.ack``)."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from served import Served, moshi_tiny

pytestmark = pytest.mark.slow
KEY = "sk-duplex-test"
FRAME_BYTES = 3840  # 80 ms of PCM16 at 24 kHz



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server's base URL, once ``/readyz`` answers 200."""
    folder = moshi_tiny(tmp_path_factory.mktemp("moshi") / "tiny")
    args = ["--model", "tiny", "--in-process", "--api-key", KEY, "--duplex-model", str(folder)]
    args += ["--duplex-sessions", "2", "--max-tokens", "4", "--talker-max-tokens", "4"]
    args += ["--duplex-resume-s", "3"]
    with Served(*args, ready_timeout_s=600) as srv:
        yield f"127.0.0.1:{srv.port}"


def connect(base: str):
    return websockets.connect(
        f"ws://{base}/v1/realtime?duplex=1", additional_headers={"Authorization": f"Bearer {KEY}"}
    )


def stats(base: str) -> dict:
    return httpx.get(f"http://{base}/stats", headers={"Authorization": f"Bearer {KEY}"}).json()


async def speak(ws, frames: int) -> None:
    """Stream ``frames`` 80 ms frames of a 220 Hz tone, paced in real time, in 40 ms appends."""
    t = np.arange(frames * 1920) / 24000
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()
    for i in range(0, len(pcm), FRAME_BYTES // 2):
        chunk = base64.b64encode(pcm[i : i + FRAME_BYTES // 2]).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        await asyncio.sleep(0.04)


async def collect(ws, frames: int) -> tuple[list[dict], list[tuple[int, str]]]:
    """Events until ``frames`` audio deltas came; also each transcript delta with the number of audio
    deltas before it (its frame's end, in frames)."""
    events, texts, audio = [], [], 0
    while audio < frames:
        e = json.loads(await asyncio.wait_for(ws.recv(), 60))
        events.append(e)
        if e["type"] == "response.output_audio.delta":
            assert len(base64.b64decode(e["delta"])) == FRAME_BYTES
            audio += 1
        elif e["type"] == "response.output_audio_transcript.delta":
            texts.append((audio, e["delta"]))
        assert e["type"] != "error", e
    return events, texts


def test_two_duplex_sessions_stream_and_ack_trims_history(served):
    async def session(frames: int):
        async with connect(served) as ws:
            first = json.loads(await ws.recv())
            assert first["type"] == "session.created"
            assert first["session"]["audio"]["input"]["turn_detection"] is None
            await ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
            speaker = asyncio.create_task(speak(ws, frames))
            events, texts = await collect(ws, frames)
            await speaker
            kinds = {e["type"] for e in events}
            assert {"response.created", "session.updated"} <= kinds
            played = frames // 2
            await ws.send(json.dumps({"type": "playback.ack", "played_ms": played * 80}))
            while (e := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != "playback.acked":
                pass
            return texts, played, e

    async def both():
        return await asyncio.gather(session(20), session(20))

    for texts, played, acked in asyncio.run(both()):
        assert len(texts) >= 10  # the model's text stream arrives as transcript deltas (token ids)
        assert all(t.strip().isdigit() for _, t in texts)
        want = "".join(t for end, t in texts if end <= played)
        assert acked["played_ms"] == played * 80
        assert acked["transcript"] == want
        assert len(want) < len("".join(t for _, t in texts))  # trimmed: the unplayed frames' text is gone


def test_vanished_client_frees_its_row_others_keep_ticking_full_engine_refused(served):
    async def main():
        async with connect(served) as keep:
            assert json.loads(await keep.recv())["type"] == "session.created"
            gone = await connect(served).__aenter__()
            assert json.loads(await gone.recv())["type"] == "session.created"
            async with connect(served) as third:  # 2 engine rows: refused, try again later
                e = json.loads(await third.recv())
                assert e["type"] == "error" and e["error"]["code"] == "session_limit_reached"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await third.recv()
                assert closed.value.rcvd.code == 1013
            await collect(gone, 3)
            gone.transport.abort()  # vanish mid-stream, no close handshake
            await collect(keep, 5)
            for _ in range(100):
                if stats(served)["duplex"]["sessions"] == 1:
                    break
                await asyncio.sleep(0.1)
            assert stats(served)["duplex"]["sessions"] == 1
            events, _ = await collect(keep, 10)  # still streaming
            async with connect(served) as again:  # the freed row admits a new session
                assert json.loads(await again.recv())["type"] == "session.created"
                await collect(again, 3)

    asyncio.run(main())


def test_cascade_realtime_answers_beside_duplex(served):
    async def main():
        client = AsyncOpenAI(base_url=f"http://{served}/v1", api_key=KEY, max_retries=0)
        async with client.realtime.connect(model="omniduplex") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
            )
            await conn.response.create()
            async with asyncio.timeout(120):
                async for e in conn:
                    assert e.type != "error", e
                    if e.type == "response.done":
                        return e

    done = asyncio.run(main())
    assert done.response.status == "completed"


def test_bad_input_gets_one_clear_error_each_and_the_stream_goes_on(served):
    async def main():
        async with connect(served) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            bad = [
                ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_audio"),
                ({"type": "playback.ack", "played_ms": -5}, "invalid_value"),
                ({"type": "response.create"}, "unsupported_in_duplex_mode"),
            ]
            for i, (event, _) in enumerate(bad):
                await ws.send(json.dumps({**event, "event_id": f"ev{i}"}))
            await ws.send("{not json")
            errors = []
            audio = 0
            while audio < 5 or len(errors) < 4:
                e = json.loads(await asyncio.wait_for(ws.recv(), 60))
                audio += e["type"] == "response.output_audio.delta"
                if e["type"] == "error":
                    errors.append(e["error"])
            got = {(x.get("event_id"), x["code"]) for x in errors}
            assert got == {
                ("ev0", "invalid_audio"),
                ("ev1", "invalid_value"),
                ("ev2", "unsupported_in_duplex_mode"),
                (None, "invalid_json"),
            }

    asyncio.run(main())


def test_a_server_without_duplex_model_refuses_duplex_mode(tmp_path):
    """Asserted on the in-process app (no second server start): ``duplex_unavailable``, close 1013."""
    from starlette.testclient import TestClient

    from omniduplex.app.server import ServerConfig, create_app

    app = create_app(ServerConfig(max_sessions=2))
    state = app.state.server
    state.started = True  # readiness is the cascade's: nothing else is started here
    # no lifespan (``TestClient`` outside ``with``): the cascade is not built; the host is marked started
    with TestClient(app).websocket_connect("/v1/realtime?duplex=1") as ws:
        e = ws.receive_json()
        assert e["type"] == "error" and e["error"]["code"] == "duplex_unavailable"
        assert ws.receive()["code"] == 1013


async def created(ws) -> str:
    e = json.loads(await ws.recv())
    assert e["type"] == "session.created"
    return e["session"]["id"]


async def until_event(ws, kind: str) -> dict:
    while (e := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != kind:
        assert e["type"] != "error" or kind == "error", e
    return e


def test_a_dropped_session_resumes_by_id_with_what_was_played_and_only_within_its_grace(served):
    async def main():
        gone = await connect(served).__aenter__()
        sid = await created(gone)
        speaker = asyncio.create_task(speak(gone, 12))
        _, texts = await collect(gone, 12)
        await speaker
        await gone.send(json.dumps({"type": "playback.ack", "played_ms": 6 * 80}))
        acked = await until_event(gone, "playback.acked")
        assert acked["transcript"] == "".join(t for end, t in texts if end <= 6)
        gone.transport.abort()  # the network drops: no close handshake
        for _ in range(50):
            if stats(served)["duplex"]["parked"] == 1:
                break
            await asyncio.sleep(0.1)
        assert stats(served)["duplex"]["parked"] == 1
        async with connect(served) as back:
            fresh = await created(back)
            assert fresh != sid
            await back.send(json.dumps({"type": "session.resume", "session_id": sid}))
            resumed = await until_event(back, "session.resumed")
            assert resumed["session"]["id"] == sid
            assert resumed["played_ms"] == 6 * 80
            assert resumed["transcript"] == acked["transcript"]  # the history: what was played
            speaker = asyncio.create_task(speak(back, 5))
            await collect(back, 5)  # the resumed session streams on
            await speaker
            await back.send(json.dumps({"type": "playback.ack", "played_ms": 6 * 80 + 160}))
            again = await until_event(back, "playback.acked")
            assert again["transcript"].startswith(acked["transcript"])
            s = stats(served)["duplex"]
            assert (s["parked"], s["resumed"]) == (0, 1)
            await back.send(json.dumps({"type": "session.resume", "session_id": "dx0-nosuch"}))
            err = await until_event(back, "error")
            assert err["error"]["code"] == "session_not_found" and "dx0-nosuch" in err["error"]["message"]
            await collect(back, 3)  # the stream goes on after the error
        # a clean close (1000) ends a session for good; a drop is resumable only within the grace (3 s)
        async with connect(served) as closed_ws:
            closed_id = await created(closed_ws)
        late = await connect(served).__aenter__()
        late_id = await created(late)
        late.transport.abort()
        await asyncio.sleep(4.5)
        async with connect(served) as ws:
            await created(ws)
            for gone_id in (closed_id, late_id):
                await ws.send(json.dumps({"type": "session.resume", "session_id": gone_id}))
                err = await until_event(ws, "error")
                assert err["error"]["code"] == "session_not_found", err
        assert stats(served)["duplex"]["expired"] >= 1

    asyncio.run(main())


def test_session_update_with_voice_and_role_prompts_restarts_behind_a_silent_prefill(served):
    async def main():
        async with connect(served) as ws:
            sid = await created(ws)
            bad = {"type": "session.update", "session": {"role_prompt_tokens": ["hello"]}, "event_id": "b1"}
            await ws.send(json.dumps(bad))
            err = await until_event(ws, "error")
            assert (err["error"]["code"], err["error"]["event_id"]) == ("invalid_value", "b1")
            assert "role_prompt_tokens" in err["error"]["message"]
            t = np.arange(5 * 1920) / 24000  # a 0.4 s reference clip: 5 Mimi frames
            clip = (0.3 * np.sin(2 * np.pi * 180 * t) * 32767).astype("<i2").tobytes()
            fields = {"voice_prompt": base64.b64encode(clip).decode(), "role_prompt_tokens": [5, 17]}
            await ws.send(json.dumps({"type": "session.update", "session": fields}))
            updated = await until_event(ws, "session.updated")
            assert updated["session"]["id"] == sid
            assert updated["session"]["prompt"] == {"voice_frames": 5, "role_tokens": 2, "prefill_ms": 640}
            speaker = asyncio.create_task(speak(ws, 16))
            events, texts = await collect(ws, 16)
            await speaker
            kind = "response.output_audio.delta"
            audio = [base64.b64decode(e["delta"]) for e in events if e["type"] == kind]
            prefill = 640 // 80  # 7 prompt frames + the acoustic delay (1 frame)
            assert all(not any(a) for a in audio[:prefill])  # the prompt itself is not sent: silence
            assert any(any(a) for a in audio[prefill:])  # then the model speaks
            assert texts and min(end for end, _ in texts) > prefill  # no text from the prefill either

    asyncio.run(main())
