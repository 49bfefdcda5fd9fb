"""HTTP surface of ``omniduplex serve`` without media: page, health, offer validation (400 with the reason).

Media, session limits and clean-up run over real WebRTC in tests/e2e/test_server_webrtc.py.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aiortc import RTCPeerConnection

from omniduplex.app.server import ServerConfig, create_app, summarize
from omniduplex.app.webrtc import OfferError, check_offer


class IdleResponder:
    """Never asked for a reply in these tests."""

    output_rate = 24000

    def start(self, turn_id, waveform, history, options=None):
        raise AssertionError("no turn expected")

    async def events(self, turn_id):
        if False:
            yield

    def cancel(self, turn_id):
        pass


async def _request(method: str, path: str, **kw) -> httpx.Response:
    app = create_app(ServerConfig(max_sessions=2), responder=IdleResponder())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kw)


def request(method: str, path: str, **kw) -> httpx.Response:
    return asyncio.run(_request(method, path, **kw))


def test_page_and_health():
    page = request("GET", "/")
    assert page.status_code == 200 and 'id="connect"' in page.text and "app.js" in page.text
    assert request("GET", "/app.js").status_code == 200
    assert request("GET", "/healthz").json() == {"status": "ok", "sessions": 0, "max_sessions": 2}
    m = request("GET", "/metrics").json()
    assert m["sessions"] == 0 and m["barge_in_stop_ms"]["n"] == 0


async def _data_channel_only_offer() -> str:
    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "body must be JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"sdp": "v=0", "type": "answer"}', "'type' must be 'offer'"),
        (b'{"type": "offer"}', "'sdp' must be a non-empty string"),
        (b'{"sdp": "hello", "type": "offer"}', "must start with 'v=0'"),
        (b'{"sdp": "v=0\\r\\nm=video 9 UDP/TLS/RTP/SAVPF 96\\r\\n", "type": "offer"}', "no audio"),
    ],
)
def test_malformed_offer_is_400_with_the_reason(body, reason):
    r = request("POST", "/offer", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and reason in r.json()["error"]


def test_offer_without_audio_is_400():
    sdp = asyncio.run(_data_channel_only_offer())
    r = request("POST", "/offer", json={"sdp": sdp, "type": "offer"})
    assert r.status_code == 400 and "no audio" in r.json()["error"]


def test_offer_that_aiortc_cannot_negotiate_is_400_and_frees_the_slot():
    sdp = "\r\n".join(
        [
            "v=0",
            "o=- 1 1 IN IP4 0.0.0.0",
            "s=-",
            "t=0 0",
            "m=audio 9 UDP/TLS/RTP/SAVPF 111",
            "c=IN IP4 0.0.0.0",
            "a=ice-ufrag:abcd",
            "a=ice-pwd:abcdefghijklmnopqrstuvwx",
            "a=fingerprint:sha-256 00:11",
            "a=setup:actpass",
            "a=mid:0",
            "a=sendrecv",
            "a=rtpmap:111 opus/48000/2",
            "",
        ]
    )

    async def main():
        app = create_app(ServerConfig(max_sessions=1), responder=IdleResponder())
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                r = await c.post("/offer", json={"sdp": sdp, "type": "offer"})
                return r, app.state.server.sessions

    r, sessions = asyncio.run(main())
    assert r.status_code == 400 and r.json()["error"].startswith("bad offer: cannot negotiate")
    assert sessions == {}


def test_hang_up_unknown_session_is_404():
    assert request("DELETE", "/sessions/nope").status_code == 404


def test_check_offer_accepts_a_browser_like_offer():
    sdp = (
        "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=ice-ufrag:x\r\n"
        "a=fingerprint:sha-256 AA\r\na=rtpmap:111 opus/48000/2\r\n"
    )
    assert check_offer(sdp, "offer") == sdp
    with pytest.raises(OfferError, match="Opus"):
        check_offer(sdp.replace("opus", "PCMU"), "offer")


def test_summarize():
    assert summarize([]) == {"n": 0, "p50": None, "p90": None, "max": None, "last": None}
    s = summarize([5.0, 1.0, 3.0])
    assert s == {"n": 3, "p50": 3.0, "p90": 5.0, "max": 5.0, "last": 3.0}
