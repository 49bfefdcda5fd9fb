"""Connecting while the server is not ready: every surface answers in its own protocol, before any session
exists, in both windows (app/host/readiness.py): the stages still starting (``serve``'s background start, no
responder yet) and a crashed stage restarting (started, the backend not ready).

Realtime: an ``error`` event then a close 1013; Twilio: 503 on the webhook, close 1013 on the media stream;
WebRTC: 503 on the offer; SIP: 503 with Retry-After; ``/readyz`` says which stage. Never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import httpx
import pytest
import websockets
from openai import AsyncOpenAI
from test_server import BROWSER_LIKE_OFFER, IdleResponder
from websockets.exceptions import ConnectionClosed

from omniduplex.app.host.state import ServerState
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.livekit.remote_link import RealtimeLink, RetryPolicy
from omniduplex.app.surfaces.phone.config import SipConfig
from omniduplex.app.surfaces.phone.sip import message as sipmsg
from omniduplex.benchmarks.local_server import LocalServer


class FakeBackend:
    """A process backend's readiness and gauges: ``up`` stage → bool, ``restarts`` stage → count."""

    def __init__(self, up: dict[str, bool], restarts: dict[str, int] | None = None) -> None:
        self.up, self.restarts = up, restarts or {}

    @property
    def ready(self) -> bool:
        return all(self.up.values())

    def stats(self) -> dict:
        return {"up": dict(self.up), "restarts": dict(self.restarts)}


class FakeOrchestrator:
    def __init__(self, backend: FakeBackend) -> None:
        self.backend, self.turns = backend, {}

    async def stop(self) -> None:
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket() as t:
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
        u.bind(("127.0.0.1", port))  # free on UDP too (SIP listens on both)
        return port


@pytest.fixture(params=["starting", "restarting"])
def window(request, monkeypatch, caplog):
    """``(kind, server, sip_port, end_window)``: ``omniduplex serve``'s app on uvicorn (a loopback port)
    inside one not-ready window, with SIP listening; ``end_window()`` brings every stage up. No session may
    be made while the window is open, and nothing may log a traceback."""
    caplog.set_level(logging.INFO)
    release, port = threading.Event(), free_port()
    sip = SipConfig(host="127.0.0.1", port=port, rtp_ports=(port + 2, port + 10))
    if request.param == "starting":

        async def slow_start(self):  # the stage processes are being spawned: asr is up, llm and tts not yet
            self.orchestrator = FakeOrchestrator(FakeBackend({"asr": True, "llm": False, "tts": False}))
            while not release.is_set():
                await asyncio.sleep(0.01)
            self.orchestrator.backend.up = dict.fromkeys(self.orchestrator.backend.up, True)
            self.responder = IdleResponder()  # the pipeline is built

        monkeypatch.setattr(ServerState, "_start", slow_start)
        app = create_app(ServerConfig(start_in_background=True, sip=sip))  # no responder until started
    else:
        app = create_app(ServerConfig(sip=sip), responder=IdleResponder())
    with LocalServer(app, start_timeout_s=60) as server:
        if request.param == "restarting":  # llm crashed and is being restarted
            backend = FakeBackend({"asr": True, "llm": False, "tts": True}, {"llm": 1})
            app.state.server.orchestrator = FakeOrchestrator(backend)

            def end_window():
                backend.up["llm"] = True
        else:
            end_window = release.set
        try:
            yield request.param, server, port, end_window
            ended, made = app.state.server.ready, app.state.server.started_total
        finally:
            release.set()
    assert ended or made == 0, "a session was made while the server was not ready"
    tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def test_readyz_says_which_stage_is_starting_or_restarting(window):
    kind, server, *_ = window
    r = httpx.get(server.url("/readyz"), timeout=10)
    assert r.status_code == 503 and httpx.get(server.url("/healthz"), timeout=10).status_code == 200
    body = r.json()
    if kind == "starting":
        assert body["status"] == "starting" and body["stages"] == {
            "asr": "up",
            "llm": "starting",
            "tts": "starting",
        }
        assert "llm, tts not up yet" in body["reason"]
    else:
        assert body["status"] == "degraded" and body["stages"] == {
            "asr": "up",
            "llm": "restarting",
            "tts": "up",
        }
        assert "llm restarting after a crash" in body["reason"]


def test_realtime_client_gets_an_error_event_then_close_1013(window):
    """Seen by the official ``openai`` SDK's realtime client."""
    kind, server, *_ = window

    async def main():
        client = AsyncOpenAI(base_url=server.url("/v1"), api_key="sk-local", max_retries=0)
        async with client.realtime.connect(model="omniduplex") as conn:
            event = await asyncio.wait_for(conn.recv(), 10)
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(conn.recv(), 10)
        return event, closed.value.rcvd

    event, close = asyncio.run(main())
    assert event.type == "error" and event.event_id.startswith("event_")
    assert event.error.type == "server_error" and event.error.code == "server_not_ready"
    assert "llm" in event.error.message
    assert ("starting" if kind == "starting" else "restarting") in event.error.message
    assert close is not None and close.code == 1013 and "llm" in close.reason


def test_twilio_webhook_is_503_and_the_media_stream_closes_1013(window):
    _, server, *_ = window
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = httpx.post(
        server.url("/phone/twilio/voice"), content="CallSid=CA1&From=%2B1555", headers=form, timeout=10
    )
    assert r.status_code == 503 and r.headers["retry-after"] == "5" and "llm" in r.text

    async def stream():
        async with websockets.connect(server.url("/phone/twilio/stream", "ws"), open_timeout=10) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        return closed.value.rcvd

    close = asyncio.run(stream())
    assert close is not None and close.code == 1013 and "llm" in close.reason


def test_webrtc_offer_is_503_with_the_reason(window):
    kind, server, *_ = window
    r = httpx.post(server.url("/offer"), json={"sdp": BROWSER_LIKE_OFFER, "type": "offer"}, timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert "try again later" in r.json()["error"] and "llm" in r.json()["error"]
    assert r.json()["status"] == ("starting" if kind == "starting" else "degraded")


def test_sip_invite_is_503_with_retry_after(window):
    _, _, port, _ = window
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(10.0)
        local = udp.getsockname()
        body = (
            "v=0\r\no=t 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {local[1] + 2} RTP/AVP 0\r\n"
        )
        invite = (
            f"INVITE sip:assistant@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {local[0]}:{local[1]};branch=z9hG4bKnotready\r\n"
            f"From: <sip:caller@{local[0]}>;tag=c1\r\nTo: <sip:assistant@127.0.0.1:{port}>\r\n"
            f"Call-ID: not-ready-1\r\nCSeq: 1 INVITE\r\nContact: <sip:caller@{local[0]}:{local[1]}>\r\n"
            f"Max-Forwards: 70\r\nContent-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        )
        udp.sendto(invite.encode(), ("127.0.0.1", port))
        responses = []
        while not responses or responses[-1].status < 200:
            responses.append(sipmsg.parse(udp.recv(65535)))
    final = responses[-1]
    assert [r.status for r in responses] == [100, 503]
    assert final.get("Retry-After") == "5" and "llm" in final.get("Warning")


def test_remote_plugin_link_retries_through_the_window_then_connects(window):
    """The LiveKit remote plugin's link takes the refusal as "down for now", retries with backoff, and
    connects once every stage is up."""
    _, server, _, end_window = window

    async def main():
        downs, connected = [], asyncio.Event()

        async def on_connected(created):
            connected.set()

        policy = RetryPolicy(initial_s=0.05, max_delay_s=0.2, give_up_after_s=None, connect_timeout_s=5.0)
        url = server.url("/v1/realtime", "ws")
        link = RealtimeLink(url, None, policy, lambda e: None, on_connected, downs.append, downs.append)
        link.start()
        try:
            deadline = time.monotonic() + 20
            while len(downs) < 2:  # refused twice: it keeps trying
                assert time.monotonic() < deadline, f"the link stopped retrying: {downs}"
                await asyncio.sleep(0.02)
            assert not connected.is_set()
            end_window()
            await asyncio.wait_for(connected.wait(), 20)
        finally:
            await link.aclose()
        return downs, link

    downs, link = asyncio.run(main())
    assert all("server_not_ready" in str(e) for e in downs) and link.connections == 1
