"""A duplex-only server: ``omniduplex serve --model DIR`` where DIR is a Moshi checkpoint (a moshi-tiny folder
written by ``init-model``), started as a subprocess with a scrubbed environment (no ``OMNIDUPLEX_*``;
:class:`served.Served`). No cascade is built: ``/readyz`` turns ready once the duplex engine is loaded, a
Twilio media stream (no ``?duplex=``), a WebRTC offer (no ``duplex`` field; the kiosk page asks for it too)
and a plain ``/v1/realtime`` (no ``?duplex=1``) run the duplex model and get its audio back, a call asking for
the cascade (``?duplex=0``, ``"duplex": false``) and ``/v1/chat/completions`` are refused with the reason (a
full-duplex speech-to-speech model, no text LLM), and the log has no traceback. One server start for all."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import websockets
from served import Served, scrubbed_env

from omniduplex.benchmarks.phone import TwilioCaller
from omniduplex.benchmarks.webrtc_client import VoiceClient

pytestmark = pytest.mark.slow
FRAME_BYTES = 3840  # 80 ms of PCM16 at 24 kHz


def tone_8k(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 8000)) / 8000
    return (0.3 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16)


async def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def test_serve_model_moshi_dir_runs_the_surfaces_on_the_duplex_model_without_a_cascade(tmp_path):
    folder = tmp_path / "moshi-tiny"
    env = scrubbed_env()
    cli = [sys.executable, "-m", "omniduplex.cli.main"]
    subprocess.run([*cli, "init-model", "--arch", "moshi-tiny", "--out", str(folder)], env=env, check=True)
    with Served("--model", str(folder), "--duplex-sessions", "2", ready_timeout_s=300) as srv:
        base = srv.url()
        assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
        assert httpx.get(f"{base}/healthz").status_code == 200
        stats = lambda: httpx.get(f"{base}/stats").json()  # noqa: E731
        assert stats()["pipeline"] == {}  # no cascade pipeline was built

        r = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert err["code"] == "not_a_chat_model" and "full-duplex speech-to-speech" in err["message"]

        async def twilio_call():
            async with websockets.connect(srv.url("/phone/twilio/stream", "ws")) as ws:
                caller = TwilioCaller(ws, "MZonly")
                await caller.start()
                caller.say(tone_8k(3.0))
                run = asyncio.create_task(caller.run())
                await until(lambda: stats()["duplex"]["sessions"] == 1, 10, "the call on the engine")
                before = caller.media_messages  # a 20 ms frame per tick keeps coming while the caller talks
                await until(lambda: caller.media_messages - before >= 100, 60, "2 s of frames while talking")
                # marks follow the model's audio (not the silence sent while the first frames come)
                await until(lambda: caller.marks_received, 15, "the model's audio reaches the caller")
                await caller.send({"event": "stop", "streamSid": "MZonly", "stop": {}})
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
            await until(lambda: stats()["duplex"]["sessions"] == 0, 10, "the row freed after stop")

        async def realtime_plain():
            async with websockets.connect(srv.url("/v1/realtime", "ws")) as ws:  # no ?duplex=1
                assert json.loads(await ws.recv())["type"] == "session.created"
                pcm = base64.b64encode(bytes(FRAME_BYTES)).decode()
                for _ in range(10):  # 800 ms of silence
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm}))
                audio = 0
                while audio < 5:
                    e = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    assert e["type"] != "error", e
                    audio += e["type"] == "response.output_audio.delta"

        async def cascade_asked():
            async with websockets.connect(srv.url("/v1/realtime?duplex=0", "ws")) as ws:
                e = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert e["type"] == "error" and e["error"]["code"] == "cascade_unavailable", e
                assert "full-duplex" in e["error"]["message"]
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd.code == 1008  # not "try again later": it never will be
            async with websockets.connect(srv.url("/phone/twilio/stream?duplex=0", "ws")) as ws:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd.code == 1008 and "full-duplex" in closed.value.rcvd.reason

        async def browser_offer():
            t = np.arange(48000 * 2) / 48000
            client = VoiceClient((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                offer = await client.offer()
                r = await http.post("/offer", json={**offer, "duplex": False})  # the cascade: none here
                assert r.status_code == 400 and "full-duplex" in r.json()["error"], r.text
                r = await http.post("/offer", json=offer)  # no choice: the duplex model
                assert r.status_code == 200 and r.json()["duplex"] is True, r.text
                await client.accept(r.json())
                await client.wait_for("duplex_text", 20)  # the model's text stream on the data channel
                await until(lambda: client.nonzero_frames > 0, 20, "the model's audio over WebRTC")
                await client.close()
                assert (await http.get("/kiosk/config.json")).json()["duplex"] is True  # the kiosk page too

        asyncio.run(twilio_call())
        asyncio.run(browser_offer())
        asyncio.run(realtime_plain())
        asyncio.run(cascade_asked())
        assert "Traceback" not in srv.log(), srv.log()[-4000:]
