"""Graceful drain (app/host/drain.py): while draining, every surface refuses new sessions and /readyz is 503;
the drain waits for replies in flight and gives up at its deadline.

The whole path (SIGTERM to ``omniduplex serve`` mid-reply) runs in tests/e2e/test_sigterm_drain.py.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest
from test_server import BROWSER_LIKE_OFFER, IdleResponder

from omniduplex.app.host.admission import SessionFull, admit
from omniduplex.app.host.drain import busy_sessions, drain
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.browser.routes import PeerOptions, open_peer


def _state(**sessions) -> SimpleNamespace:
    return SimpleNamespace(
        sessions={sid: SimpleNamespace(id=sid, session=s) for sid, s in sessions.items()},
        draining=False,
        cfg=SimpleNamespace(max_sessions=8),
        started_total=0,
    )


def test_busy_sessions_are_those_with_a_reply_or_a_committed_turn():
    st = _state(
        idle=SimpleNamespace(busy=False),
        playing=SimpleNamespace(busy=True),
        committed=SimpleNamespace(busy=True),
    )
    assert sorted(busy_sessions(st)) == ["committed", "playing"]


def test_drain_waits_for_the_reply_in_flight_then_returns_true():
    s = SimpleNamespace(busy=True)
    st = _state(a=s)

    async def main():
        async def finish():
            await asyncio.sleep(0.3)
            s.busy = False

        task = asyncio.create_task(finish())
        ok = await drain(st, deadline_s=30.0, poll_s=0.02)
        finished_first = task.done()  # drain returned only once the reply had ended
        await task
        return ok, finished_first

    ok, finished_first = asyncio.run(main())
    assert ok and st.draining and finished_first


def test_drain_gives_up_at_its_deadline():
    st = _state(stuck=SimpleNamespace(busy=True))
    t0 = time.monotonic()
    assert asyncio.run(drain(st, deadline_s=0.2, poll_s=0.02)) is False
    assert time.monotonic() - t0 < 2.0  # it did not wait for the reply


def test_a_draining_server_admits_no_call():
    st = _state()
    st.draining = True
    with pytest.raises(SessionFull, match="draining"):
        admit(st, SimpleNamespace(id="c1", session=None))
    assert st.sessions == {}


def test_a_draining_server_answers_503_to_readyz_and_to_offers():
    app = create_app(ServerConfig(max_sessions=2), responder=IdleResponder())
    state = app.state.server

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                assert (await client.get("/readyz")).status_code == 200
                state.draining = True
                ready = await client.get("/readyz")
                with pytest.raises(SessionFull, match="draining"):
                    await open_peer(state, "v=0\r\n", PeerOptions())
                offer = await client.post("/offer", json={"sdp": BROWSER_LIKE_OFFER, "type": "offer"})
                return ready, offer

    ready, offer = asyncio.run(main())
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert offer.status_code == 503 and "draining" in offer.text
