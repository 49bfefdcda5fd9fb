"""The browser, kiosk and phone surfaces on the duplex model, against ``omniduplex serve --model tiny
--duplex-model DIR --duplex-surfaces phone,kiosk`` (a moshi-tiny folder written by ``init-model``) started as
a subprocess (loopback, no API keys) with a scrubbed environment (no ``OMNIDUPLEX_*``), driven by real
clients: a Twilio media-stream caller (:class:`omniduplex.benchmarks.phone.TwilioCaller`, μ-law 8 kHz every
20 ms) and an aiortc WebRTC peer (:class:`omniduplex.benchmarks.webrtc_client.VoiceClient`, Opus 48 kHz).
Both get the model's audio back every frame while they send theirs; a client that vanishes frees its engine
row; the cascade answers beside it."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest
import websockets
from served import Served, moshi_tiny

from omniduplex.benchmarks.phone import TwilioCaller
from omniduplex.benchmarks.webrtc_client import VoiceClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server's ``host:port`` once ``/readyz`` answers 200."""
    folder = moshi_tiny(tmp_path_factory.mktemp("moshi") / "tiny")
    args = ["--model", "tiny", "--in-process", "--duplex-model", str(folder), "--duplex-sessions", "2"]
    args += ["--duplex-surfaces", "phone,kiosk", "--max-tokens", "4", "--talker-max-tokens", "4"]
    args += ["--media-timeout", "2"]
    with Served(*args, ready_timeout_s=600) as srv:
        yield f"127.0.0.1:{srv.port}"


def stats(base: str) -> dict:
    return httpx.get(f"http://{base}/stats").json()


async def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def tone_8k(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 8000)) / 8000
    return (0.3 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16)


def test_twilio_caller_hears_the_model_every_frame_and_a_vanished_caller_frees_its_row(served):
    async def main():
        url = f"ws://{served}/phone/twilio/stream"  # --duplex-surfaces phone: duplex by default
        async with websockets.connect(url) as ws1, websockets.connect(url) as ws2:
            callers = [TwilioCaller(ws1, "MZone"), TwilioCaller(ws2, "MZtwo")]
            runs = []
            for c in callers:
                await c.start()
                c.say(tone_8k(3.0))
                runs.append(asyncio.create_task(c.run()))
            await until(lambda: stats(served)["duplex"]["sessions"] == 2, 10, "both calls on the engine")
            # both sides talk at once: the caller's tone in, the model's audio out, one 20 ms frame per tick
            # (how fast the ticks come is the benchmark's business: `bench duplex`; here, that they go on)
            for c, b in [(c, c.media_messages) for c in callers]:
                await until(lambda c=c, b=b: c.media_messages - b >= 100, 60, "2 s of frames while both talk")
                assert c.marks_received and c.marks_sent_back  # marks follow the model's audio
                assert c.played_audio  # the model's (random-weight) audio is not silence
            ws2.transport.abort()  # the second caller vanishes mid-call, no stop, no close handshake
            await until(lambda: stats(served)["duplex"]["sessions"] == 1, 10, "the vanished row freed")
            n = callers[0].media_messages
            await until(lambda: callers[0].media_messages - n >= 25, 30, "the other call streams on")
            await callers[0].send({"event": "stop", "streamSid": "MZone", "stop": {}})
            for r in runs:
                r.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
        await until(lambda: stats(served)["duplex"]["sessions"] == 0, 10, "rows freed after stop")

    asyncio.run(main())


def test_full_engine_refuses_a_duplex_call_and_duplex_0_gets_the_cascade(served):
    async def main():
        url = f"ws://{served}/phone/twilio/stream"
        async with websockets.connect(url) as a, websockets.connect(url) as b:
            for ws, sid in ((a, "MZa"), (b, "MZb")):
                await TwilioCaller(ws, sid).start()
            await until(lambda: stats(served)["duplex"]["sessions"] == 2, 10, "two rows taken")
            async with websockets.connect(url) as third:  # 2 rows: try again later
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(third.recv(), 10)
                assert closed.value.rcvd.code == 1013
            async with websockets.connect(url + "?duplex=0") as cascade:  # the cascade, beside
                caller = TwilioCaller(cascade, "MZcascade")
                await caller.start()
                await until(lambda: stats(served)["sessions"] == 3, 10, "the cascade call admitted")
                assert stats(served)["duplex"]["sessions"] == 2

    asyncio.run(main())


def test_browser_peer_on_the_duplex_model_gets_audio_every_frame_and_its_slot_frees(served):
    async def main():
        t = np.arange(48000 * 3) / 48000
        client = VoiceClient((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
        async with httpx.AsyncClient(base_url=f"http://{served}", timeout=30) as http:
            r = await http.post("/offer", json={**await client.offer(), "duplex": True})
            assert r.status_code == 200, r.text
            assert r.json()["duplex"] is True
            await client.accept(r.json())
            started = await client.wait_for("session_started", 20)
            assert started["duplex"] is True
            await until(lambda: client.audio_frames > 0, 20, "first audio frame")
            n = client.audio_frames  # 20 ms Opus frames keep coming while the peer talks
            await until(lambda: client.audio_frames - n >= 100, 60, "2 s of frames while the peer talks")
            assert client.nonzero_frames > 0  # the model's audio, not only silence
            await client.wait_for("duplex_text", 10)  # the model's text stream on the data channel
            assert stats(served)["duplex"]["sessions"] == 1
            client.mic.vanish()  # no more packets, no bye: the media timeout (2 s) frees the row
            await until(lambda: stats(served)["duplex"]["sessions"] == 0, 15, "the vanished peer freed")
            await client.close()
            cfg = (await http.get("/kiosk/config.json")).json()
            assert cfg["duplex"] is True  # --duplex-surfaces kiosk: the kiosk page asks for the duplex model

    asyncio.run(main())
