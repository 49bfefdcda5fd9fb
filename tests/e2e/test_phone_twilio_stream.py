"""The Twilio media-stream bridge over a real WebSocket: the app under uvicorn on a loopback port, a client
playing Twilio's part (``omniduplex.benchmarks.phone.TwilioCaller``) that streams ``examples/question.wav``
as μ-law 20 ms frames in real time. The replies come from a scripted tone responder, so no model runs here."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest
import websockets
from _phone import QUESTION, WORD_S, WORDS, ServedApp, ToneResponder, question_8k
from _sip import thread_cpu_s

from omniduplex.app.core.session import SessionConfig
from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.phone.config import TwilioConfig
from omniduplex.app.surfaces.phone.twilio_routes import twilio_signature
from omniduplex.benchmarks.phone import TwilioCaller

pytestmark = pytest.mark.slow
log = logging.getLogger("test.phone.twilio")


def served(**kw) -> ServedApp:
    cfg = ServerConfig(session=SessionConfig(turn=TurnConfig(endpoint_ms=500)), **kw)
    return ServedApp(create_app(cfg, responder=ToneResponder()))


async def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached after {timeout} s")
        await asyncio.sleep(0.02)


def call_of(state):
    calls = [c for c in state.sessions.values() if hasattr(c, "bridge")]
    return calls[0] if calls else None


def test_reply_with_marks_then_barge_in_clears_and_history_keeps_the_played_part():
    q = question_8k()

    async def main(srv: ServedApp):
        async with websockets.connect(f"ws://127.0.0.1:{srv.port}/phone/twilio/stream") as ws:
            tw = TwilioCaller(ws)
            await tw.start()
            runner = asyncio.create_task(tw.run())
            await until(lambda: call_of(srv.state) is not None, 5, "call admitted")
            call = call_of(srv.state)
            tw.say(np.zeros(4000, np.int16))
            tw.say(q)
            await until(lambda: tw.first_reply_audio_at is not None, 15, "reply audio")
            latency_ms = 1000 * (tw.first_reply_audio_at - tw.speech_ends[0])
            await until(lambda: tw.reply_seconds_played() >= 1.2, 5, "1.2 s of reply played")
            played_before = tw.played
            t_talk = time.monotonic()
            tw.say(q)  # the caller talks over the reply
            await until(lambda: tw.clears, 5, "clear")
            heard_s = tw.played / 8000
            await asyncio.sleep(0.5)
            audible_after_clear = [t for t, _ in tw.played_audio if t > tw.clears[0] + 0.001]
            history = [list(e) for e in call.session.history.entries]
            bridge = call.bridge
            await tw.send({"event": "stop", "sequenceNumber": "9", "streamSid": tw.sid, "stop": {}})
            await asyncio.wait_for(runner, 5)
            await until(lambda: not srv.state.sessions, 5, "call released")
            return tw, bridge, history, latency_ms, t_talk, played_before, heard_s, audible_after_clear

    with served() as srv:
        cpu0, t0 = thread_cpu_s(srv.thread), time.monotonic()
        tw, bridge, history, latency_ms, t_talk, played_before, heard_s, audible = asyncio.run(main(srv))
        cpu, wall = thread_cpu_s(srv.thread) - cpu0, time.monotonic() - t0
        server_latency_ms = srv.state.metrics()["speech_end_to_first_audio_ms"]["last"]
    # reply media arrived with marks, and the marks we echoed were ours
    assert tw.media_messages >= 60 and len(tw.marks_received) >= 10
    assert all(name.rsplit("@", 1)[1].isdigit() for name in tw.marks_received)
    # barge-in: one clear, and no reply audio played after it (how many ms the clear took is a latency
    # figure, printed below; `omniduplex bench realtime` measures barge-in timing)
    assert len(bridge.clear_ms) == 1, bridge.clear_ms
    talk_to_clear_ms = 1000 * (tw.clears[0] - t_talk)
    assert talk_to_clear_ms > 0  # the clear answered the caller's speech, not something before it
    assert audible == []
    # the history keeps what was heard: whole words up to the playback position at the barge-in
    assistant = [text for role, text in history if role == "assistant"]
    assert len(assistant) == 1
    kept = assistant[0].split()
    assert kept == WORDS[: len(kept)] and 2 <= len(kept) <= len(WORDS) - 1, kept
    assert abs(len(kept) - heard_s / WORD_S) <= 1.0, (kept, heard_s)
    print(
        f"\n[twilio] speech end → first reply audio {latency_ms:.0f} ms at the caller "
        f"({server_latency_ms:.0f} ms at the server); server CPU {100 * cpu / wall:.1f}% of a core; "
        f"barge-in detection → clear {bridge.clear_ms[0]:.1f} ms; caller starts talking → clear "
        f"{talk_to_clear_ms:.0f} ms; heard {heard_s:.2f} s, history keeps {' '.join(kept)!r}"
    )


def test_bad_messages_are_logged_and_skipped_and_other_calls_go_on(caplog):
    q = question_8k()
    caplog.set_level(logging.WARNING, logger="omniduplex.phone.twilio")

    async def one_call(port: int, garbage: bool):
        async with websockets.connect(f"ws://127.0.0.1:{port}/phone/twilio/stream") as ws:
            tw = TwilioCaller(ws, stream_sid="MZbad" if garbage else "MZgood")
            if garbage:
                await tw.send("{not json")
                await tw.send({"event": "dance", "streamSid": "x"})
                await tw.send({"event": "media", "streamSid": "x", "media": {"payload": "//8="}})
                await tw.send({"event": "media", "media": {}})
                await tw.send([1, 2])
            await tw.start()
            if garbage:
                await tw.send({"event": "media", "streamSid": tw.sid, "media": {"payload": "!!not base64"}})
                await tw.send({"event": "mark", "streamSid": tw.sid, "mark": {"name": "not-ours"}})
                await tw.send(
                    {"event": "dtmf", "streamSid": tw.sid, "dtmf": {"track": "inbound_track", "digit": "5"}}
                )
            runner = asyncio.create_task(tw.run())
            tw.say(np.zeros(4000, np.int16))
            tw.say(q)
            await until(lambda: tw.reply_seconds_played() > 0.5, 15, "reply audio")
            await ws.close()
            await asyncio.wait_for(runner, 5)
            return tw

    async def main(srv: ServedApp):
        return await asyncio.gather(one_call(srv.port, True), one_call(srv.port, False))

    with served() as srv:
        bad, good = asyncio.run(main(srv))
        deadline = time.monotonic() + 5
        while srv.state.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.state.sessions == {}
    assert bad.played_audio and good.played_audio
    messages = " | ".join(r.getMessage() for r in caplog.records)
    for reason in ("not JSON", "'dance'", "'media' before 'start'", "not base64", "not one of ours"):
        assert reason in messages, (reason, messages)


def test_unsupported_media_format_ends_the_call_cleanly():
    async def main(srv: ServedApp):
        async with websockets.connect(f"ws://127.0.0.1:{srv.port}/phone/twilio/stream") as ws:
            tw = TwilioCaller(ws)
            await tw.start({"encoding": "audio/l16", "sampleRate": 16000, "channels": 1})
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
        await until(lambda: not srv.state.sessions, 5, "call released")

    with served() as srv:
        asyncio.run(main(srv))


def test_stream_handshake_needs_a_valid_signature_when_a_token_is_set():
    token = "test-token"

    async def main(srv: ServedApp):
        url = f"ws://127.0.0.1:{srv.port}/phone/twilio/stream"
        with pytest.raises(websockets.InvalidStatus) as e:
            async with websockets.connect(url, additional_headers={"X-Twilio-Signature": "bogus"}):
                pass
        assert e.value.response.status_code == 403
        good = twilio_signature(token, "wss://example.test/phone/twilio/stream")
        async with websockets.connect(url, additional_headers={"X-Twilio-Signature": good}) as ws:
            await TwilioCaller(ws).start()

    with served(twilio=TwilioConfig(auth_token=token, public_url="https://example.test")) as srv:
        asyncio.run(main(srv))


def test_bench_phone_times_speech_end_to_first_reply_media():
    """``omniduplex bench phone``'s measure of one call: after the end of turn (500 ms of silence) and the
    responder's 50 ms, the first tone arrives; never before the caller stopped speaking."""
    from omniduplex.benchmarks.phone import _call, phone_audio

    with served() as srv:
        url = f"ws://127.0.0.1:{srv.port}/phone/twilio/stream"
        first_media_ms = asyncio.run(_call(url, phone_audio(QUESTION), timeout=30))
    assert first_media_ms is not None and 500 <= first_media_ms < 5000, first_media_ms
