"""One phone call through the real default pipeline (the cascade: Whisper → LLM → Piper, in-process): a
Twilio-protocol client asks ``examples/question.wav`` over μ-law 8 kHz and hears a spoken answer."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import soxr
import webrtcvad
import websockets
from _phone import ServedApp, question_8k

from omniduplex.app.core.session import SessionConfig
from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.phone import TwilioCaller

pytestmark = pytest.mark.slow


def voiced_fraction(pcm8k: np.ndarray) -> float:
    vad = webrtcvad.Vad(2)
    x = soxr.resample(pcm8k.astype(np.float32) / 32768, 8000, 16000)
    frames = [(np.clip(x[i : i + 320], -1, 1) * 32767).astype(np.int16) for i in range(0, x.size - 320, 320)]
    return sum(vad.is_speech(f.tobytes(), 16000) for f in frames) / max(1, len(frames))


def test_a_phone_call_through_the_default_pipeline():
    turn = TurnConfig(endpoint_ms=500)
    cfg = ServerConfig(session=SessionConfig(turn=turn), processes=False, max_tokens=32)
    srv = ServedApp(create_app(cfg))

    async def main():
        async with websockets.connect(f"ws://127.0.0.1:{srv.port}/phone/twilio/stream") as ws:
            tw = TwilioCaller(ws)
            await tw.start()
            runner = asyncio.create_task(tw.run())
            tw.say(np.zeros(4000, np.int16))
            tw.say(question_8k())
            deadline = time.monotonic() + 90
            while tw.first_reply_audio_at is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert tw.first_reply_audio_at is not None, "no reply audio within 90 s"
            latency_ms = 1000 * (tw.first_reply_audio_at - tw.speech_ends[0])
            call = next(iter(srv.state.sessions.values()))
            def finished() -> bool:  # the reply has ended and both turns are in the history
                return not call.session.busy and len(call.session.history.entries) >= 2

            while not finished() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            history = [list(e) for e in call.session.history.entries]
            await tw.send({"event": "stop", "streamSid": tw.sid, "stop": {}})
            await asyncio.wait_for(runner, 10)
            return tw, latency_ms, history, srv.state.metrics()

    with srv:
        tw, latency_ms, history, metrics = asyncio.run(main())
    reply = np.concatenate([f for _, f in tw.played_audio])
    voiced = voiced_fraction(reply)
    print(
        f"\n[twilio/pipeline] speech end → first reply audio {latency_ms:.0f} ms at the caller "
        f"({metrics['speech_end_to_first_audio_ms']['last']:.0f} ms at the server); "
        f"{reply.size / 8000:.1f} s of reply, {voiced:.0%} voiced; history {history}"
    )
    assert reply.size / 8000 > 0.5 and voiced > 0.4
    assert [role for role, _ in history] == ["user", "assistant"]
    assert not history[0][1].startswith("[spoken turn") and history[1][1]  # ASR transcript; reply text
