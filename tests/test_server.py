"""HTTP surface of ``omniduplex serve`` without media: page, health, readiness, metrics, offer validation
(400 with the reason).

Media, session limits and clean-up run over real WebRTC in tests/e2e/test_server_webrtc.py.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aiortc import RTCPeerConnection
from prometheus_client.parser import text_string_to_metric_families

from omniduplex.app.core.events import ReplyAudioStarted, ReplyEnded, UserTurnCommitted
from omniduplex.app.host.state import ServerState, summarize
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.browser.webrtc import OfferError, check_offer

BROWSER_LIKE_OFFER = (
    "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=ice-ufrag:x\r\n"
    "a=fingerprint:sha-256 AA\r\na=rtpmap:111 opus/48000/2\r\n"
)


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
    assert request("GET", "/readyz").json() == {"status": "ready"}
    m = request("GET", "/stats").json()
    assert m["sessions"] == 0 and m["barge_in_stop_ms"]["n"] == 0


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``(sample name, sorted labels) → value`` of a Prometheus text exposition (raises unless it parses)."""
    return {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }


def test_metrics_is_prometheus_text_fed_by_session_events():
    async def main():
        app = create_app(ServerConfig(max_sessions=2), responder=IdleResponder())
        async with app.router.lifespan_context(app):
            observe = app.state.server.responder.observe  # what Session.emit calls
            observe(UserTurnCommitted("s1", turn_id="s1-1"))
            observe(ReplyAudioStarted("s1", turn_id="s1-1", latency_ms=700.0, commit_to_audio_ms=180.0))
            observe(ReplyEnded("s1", turn_id="s1-1", reason="interrupted", stop_ms=30.0))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return await client.get("/metrics")

    r = asyncio.run(main())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = samples(r.text)
    assert m[("omniduplex_sessions", ())] == 0 and m[("omniduplex_max_sessions", ())] == 2
    assert m[("omniduplex_turns_total", ())] == 1
    assert m[("omniduplex_replies_total", (("reason", "interrupted"),))] == 1
    assert m[("omniduplex_ttfp_seconds_count", ())] == 1 and m[("omniduplex_ttfp_seconds_sum", ())] == 0.18
    assert m[("omniduplex_ttfp_seconds_bucket", (("le", "0.2"),))] == 1
    assert m[("omniduplex_ttfp_seconds_bucket", (("le", "0.15"),))] == 0
    assert m[("omniduplex_barge_in_stop_seconds_count", ())] == 1
    assert m[("omniduplex_e2el_seconds_count", ())] == 0


def test_each_app_has_its_own_registry():
    a, b = create_app(ServerConfig()), create_app(ServerConfig())
    a.state.server.prom.turns.inc()
    assert "omniduplex_turns_total 1.0" in a.state.server.prom.render().decode()
    assert "omniduplex_turns_total 0.0" in b.state.server.prom.render().decode()


def test_readyz_is_503_until_a_background_start_is_done(monkeypatch):
    """``serve`` starts the pipeline in the background: liveness at once, readiness (and sessions) after."""

    async def main():
        release = asyncio.Event()

        async def slow_start(self):
            await release.wait()

        monkeypatch.setattr(ServerState, "_start", slow_start)
        app = create_app(ServerConfig(start_in_background=True), responder=IdleResponder())
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                before = [await client.get(p) for p in ("/healthz", "/readyz")]
                offer = await client.post("/offer", json={"sdp": BROWSER_LIKE_OFFER, "type": "offer"})
                release.set()
                for _ in range(100):
                    after = await client.get("/readyz")
                    if after.status_code == 200:
                        break
                    await asyncio.sleep(0.01)
                return before, offer, after

    (health, ready), offer, after = asyncio.run(main())
    assert health.status_code == 200
    assert ready.status_code == 503 and ready.json()["status"] == "starting"
    assert ready.json()["reason"] == "the server is starting: loading models"
    assert offer.status_code == 503 and "try again later: the server is starting" in offer.json()["error"]
    assert after.status_code == 200


def test_readyz_reports_a_failed_background_start(monkeypatch):
    async def main():
        async def broken_start(self):
            raise RuntimeError("no weights here")

        monkeypatch.setattr(ServerState, "_start", broken_start)
        app = create_app(ServerConfig(start_in_background=True), responder=IdleResponder())
        failed = []
        app.state.server.on_start_failed = lambda: failed.append(True)
        async with app.router.lifespan_context(app):
            await asyncio.sleep(0.05)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return await client.get("/readyz"), failed

    r, failed = asyncio.run(main())
    assert r.status_code == 503 and r.json()["status"] == "failed" and r.json()["error"] == "no weights here"
    assert r.json()["reason"] == "the pipeline failed to start: no weights here"
    assert failed == [True]


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
    sdp = BROWSER_LIKE_OFFER
    assert check_offer(sdp, "offer") == sdp
    with pytest.raises(OfferError, match="Opus"):
        check_offer(sdp.replace("opus", "PCMU"), "offer")


def test_summarize():
    assert summarize([]) == {"n": 0, "p50": None, "p90": None, "max": None, "last": None}
    s = summarize([5.0, 1.0, 3.0])
    assert s == {"n": 3, "p50": 3.0, "p90": 5.0, "max": 5.0, "last": 3.0}
