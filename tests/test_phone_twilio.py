"""The Twilio Media Streams protocol without sockets: typed parsing, outbound messages, request signatures
(Twilio's published example), the voice webhook (TwiML, 403), and a :class:`TwilioBridge` driven message by
message: pacing lead, marks, barge-in → clear, truncation of the history to the marks echoed.
Over a real WebSocket: tests/e2e/test_phone_twilio_stream.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soxr

from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta
from omniduplex.app.core.session import SessionConfig
from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.phone import twilio
from omniduplex.app.surfaces.phone.config import TwilioConfig
from omniduplex.app.surfaces.phone.twilio_routes import connect_stream_twiml, twilio_signature
from omniduplex.app.surfaces.wire.g711 import ulaw_encode
from omniduplex.pipeline.audio_io import load_audio

START = {
    "event": "start",
    "streamSid": "MZ1",
    "start": {
        "streamSid": "MZ1",
        "callSid": "CA1",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"k": "v"},
    },
}


def test_parse_inbound_events():
    assert isinstance(
        twilio.parse_inbound('{"event":"connected","protocol":"Call","version":"1.0.0"}'), twilio.Connected
    )
    ev = twilio.parse_inbound(json.dumps(START))
    assert (
        isinstance(ev, twilio.Start) and ev.start.mediaFormat.sampleRate == 8000 and ev.start.customParameters
    )
    media = twilio.parse_inbound(
        '{"event":"media","streamSid":"MZ1","media":{"track":"inbound","payload":"/w=="}}'
    )
    assert isinstance(media, twilio.Media) and media.media.payload == "/w=="
    assert twilio.parse_inbound('{"event":"mark","mark":{"name":"t@160"}}').mark.name == "t@160"
    assert twilio.parse_inbound('{"event":"dtmf","dtmf":{"digit":"7"}}').dtmf.digit == "7"
    assert isinstance(twilio.parse_inbound('{"event":"stop","streamSid":"MZ1","stop":{}}'), twilio.Stop)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{oops", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"event": 3}', "not a JSON object"),
        ('{"event":"dance"}', "'dance'"),
        ('{"event":"media","media":{}}', "payload"),
        ('{"event":"start","streamSid":"x","start":{}}', "mediaFormat"),
    ],
)
def test_parse_inbound_rejects_with_the_reason(text, why):
    with pytest.raises(twilio.ProtocolError, match=why):
        twilio.parse_inbound(text)


def test_outbound_messages():
    m = json.loads(twilio.media_message("MZ1", b"\xff\x00"))
    assert m == {
        "event": "media",
        "streamSid": "MZ1",
        "media": {"payload": base64.b64encode(b"\xff\x00").decode()},
    }
    assert json.loads(twilio.mark_message("MZ1", "a@1")) == {
        "event": "mark",
        "streamSid": "MZ1",
        "mark": {"name": "a@1"},
    }
    assert json.loads(twilio.clear_message("MZ1")) == {"event": "clear", "streamSid": "MZ1"}


def test_signature_matches_twilios_published_example():
    params = [
        ("CallSid", "CA1234567890ABCDE"),
        ("Caller", "+12349013030"),
        ("Digits", "1234"),
        ("From", "+12349013030"),
        ("To", "+18005551212"),
    ]
    assert (
        twilio_signature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", params)
        == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    )


def test_twiml_connects_a_bidirectional_stream():
    xml = connect_stream_twiml("wss://h/phone/twilio/stream", {"From": "+1<2>"})
    assert xml.endswith(
        '<Response><Connect><Stream url="wss://h/phone/twilio/stream">'
        '<Parameter name="From" value="+1&lt;2&gt;"/></Stream></Connect></Response>'
    )


class IdleResponder:
    output_rate = 24000

    def start(self, *a, **k):
        raise AssertionError("no turn expected")

    async def events(self, turn_id):
        if False:
            yield

    def cancel(self, turn_id):
        pass


def post_voice(twilio_cfg: TwilioConfig, body: str, headers: dict) -> httpx.Response:
    async def main():
        app = create_app(ServerConfig(twilio=twilio_cfg), responder=IdleResponder())
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="https://voice.example") as c:
                return await c.post("/phone/twilio/voice", content=body, headers=headers)

    return asyncio.run(main())


def test_voice_webhook_answers_twiml_and_checks_the_signature():
    body = "CallSid=CA9&From=%2B15551234&To=%2B15559876"
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = post_voice(TwilioConfig(auth_token=None), body, form)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/xml")
    assert '<Stream url="wss://voice.example/phone/twilio/stream">' in r.text and 'value="CA9"' in r.text
    cfg = TwilioConfig(auth_token="tok")
    assert post_voice(cfg, body, form).status_code == 403
    assert post_voice(cfg, body, {**form, "X-Twilio-Signature": "AAAA"}).status_code == 403
    sig = twilio_signature(
        "tok",
        "https://voice.example/phone/twilio/voice",
        [("CallSid", "CA9"), ("From", "+15551234"), ("To", "+15559876")],
    )
    assert post_voice(cfg, body, {**form, "X-Twilio-Signature": sig}).status_code == 200


NO_PREEMPT = TurnConfig(preemptive_ms=0)
"""Turn-taking without preemptive generation: the replies here are those of committed turns only."""


class ToneReply:
    """Replies with four 0.5 s tones (one word each); cancel ends the stream."""

    output_rate = 24000
    words = ["one", "two", "three", "four"]

    def __init__(self) -> None:
        self.cancelled = set()

    def start(self, turn_id, waveform, history, options=None):
        pass

    async def events(self, turn_id):
        t = np.arange(12000) / 24000
        for i, w in enumerate(self.words):
            if turn_id in self.cancelled:
                yield ReplyFailed("cancelled")
                return
            text = w if i == 0 else " " + w
            yield ReplyTextDelta(text)
            yield ReplyAudioChunk((0.3 * np.sin(2 * np.pi * 400 * t)).astype(np.float32), text)
        yield ReplyDone({})

    def cancel(self, turn_id):
        self.cancelled.add(turn_id)


def media(pcm: np.ndarray) -> str:
    payload = base64.b64encode(ulaw_encode(pcm)).decode()
    return json.dumps(
        {"event": "media", "streamSid": "MZ1", "media": {"track": "inbound", "payload": payload}}
    )


def test_bridge_paces_reply_with_marks_then_clears_on_barge_in_and_truncates_to_the_marks():
    q = load_audio(Path(__file__).parents[1] / "examples" / "question.wav")
    speech = (np.clip(soxr.resample(q, 16000, 8000), -1, 1) * 32767).astype(np.int16)
    frames = [speech[i : i + 160] for i in range(0, speech.size - 160, 160)]
    silence = np.zeros(160, np.int16)

    async def main():
        sent: list[tuple[float, dict]] = []  # (the bridge's frame clock: due time of the tick, message)

        async def send(text):
            sent.append((bridge.port.pacer.due, json.loads(text)))

        async def until(predicate, timeout_s=20.0):
            deadline = time.monotonic() + timeout_s
            while not predicate():
                assert time.monotonic() < deadline, "timed out"
                await asyncio.sleep(0.01)

        bridge = twilio.TwilioBridge(
            "tw-test", ToneReply(), SessionConfig(turn=NO_PREEMPT), send, lead_ms=100, mark_ms=100
        )
        assert bridge.handle(media(silence))  # before start: logged, skipped
        assert bridge.errors == 1
        assert bridge.handle(json.dumps(START))
        for f in [silence] * 10 + frames + [silence] * 30:  # faster than real time: the session counts frames
            bridge.handle(media(f))
        await until(lambda: sum(m["event"] == "media" for _, m in sent) >= 30)  # 0.6 s of reply sent
        reply = [(t, m) for t, m in sent if m["event"] == "media"]
        burst = sum(t == reply[0][0] for t, _ in reply)  # frames sent on the reply's first tick
        ahead = max((k + 1) * 0.020 - (t - reply[0][0]) for k, (t, _) in enumerate(reply))
        marks = [m["mark"]["name"] for _, m in sent if m["event"] == "mark"]
        heard = marks[2]  # the caller has heard up to the third mark (~0.3 s)
        bridge.handle(json.dumps({"event": "mark", "streamSid": "MZ1", "mark": {"name": heard}}))
        for f in frames[:30]:  # the caller talks over the reply
            bridge.handle(media(f))
            await asyncio.sleep(0.005)
        def truncated() -> bool:  # the interrupted reply ended and was truncated to the marks (0.3 s)
            record = bridge.session.reply_record("tw-test-1")
            return (
                bridge.session.reply_turn_id != "tw-test-1"
                and record is not None
                and record.played_ms <= 300 + 1e-6
            )

        await until(truncated)
        history = [list(e) for e in bridge.session.history.entries]
        played = round(bridge.session.reply_record("tw-test-1").played_ms * 8)  # samples at 8 kHz
        await bridge.close("test over")
        return sent, burst, ahead, marks, heard, bridge, history, played

    sent, burst, ahead, marks, heard, bridge, history, played = asyncio.run(main())
    # on the bridge's own frame clock: the first tick fills the lead (100 ms = 5 frames, one more for float
    # rounding), and the reply never runs further ahead of the caller's ear than the lead plus one frame
    assert burst in (5, 6) and 0.1 - 1e-9 <= ahead <= 0.12 + 1e-9
    assert all(name.startswith("tw-test-1@") for name in marks)
    assert int(marks[1].split("@")[1]) - int(marks[0].split("@")[1]) == 800  # a mark per 100 ms at 8 kHz
    kinds = [m["event"] for _, m in sent]
    assert kinds.count("clear") == 1 and len(bridge.clear_ms) == 1
    assert "media" not in kinds[kinds.index("clear") + 1 :]
    # > 0.5 s had been sent (the session alone would keep "one"), the caller heard 0.3 s: "one" unfinished
    assert int(heard.split("@")[1]) == 2400 == played
    assert [role for role, _ in history] == ["user"]
