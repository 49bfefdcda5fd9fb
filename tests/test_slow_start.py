"""A slow first start (a loaded machine, one-time model imports and kernel builds) keeps ``omniduplex
serve`` up: past the start limit (``serve --start-timeout``) the stages are reported late in ``/readyz`` and
the log, every surface answers "not ready" (Realtime ``server_not_ready``), and the server is ready once they
are, instead of exiting with ``StageStartError``. A backend told not to wait (the default of a bare
``ProcessBackend``) still gives up at the limit and leaves nothing behind.

The stages are real stage processes of the tiny random Qwen3-Omni graph; a spawned stage process imports
torch before it can report ready, so it is never ready within the 50 ms limit used here.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from openai import AsyncOpenAI
from shm_leaks import left_behind
from websockets.exceptions import ConnectionClosed

from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.runtime.process_backend import ProcessBackend, StageStartError
from omniduplex.relay import list_segments

LIMIT_S = 0.05


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=6)


@pytest.mark.slow
def test_serve_stays_up_past_the_start_limit_then_becomes_ready(ckpt):
    from omniduplex.app.server import ServerConfig, create_app

    cfg = ServerConfig(model=str(ckpt), processes=True, start_in_background=True, start_timeout_s=LIMIT_S)
    with LocalServer(create_app(cfg), start_timeout_s=60) as server:
        state, late, refused = server.state, None, None
        deadline = time.monotonic() + 600
        while late is None:  # not ready, the stages past the limit: /readyz says so, the server answers
            assert time.monotonic() < deadline and state.start_error is None
            body = httpx.get(server.url("/readyz"), timeout=10).json()
            if "start limit" in body.get("reason", ""):
                late = body
                refused = asyncio.run(_realtime_first_event(server))
            time.sleep(0.05)
        while httpx.get(server.url("/readyz"), timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the stages never came up"
            assert state.start_error is None, state.start_error
            time.sleep(0.2)
        assert httpx.get(server.url("/healthz"), timeout=10).status_code == 200
    assert late["status"] == "starting"
    assert f"past the {LIMIT_S:g} s start limit: still waiting" in late["reason"]
    assert refused.type == "error" and refused.error.code == "server_not_ready"
    assert "not up yet" in refused.error.message


async def _realtime_first_event(server):
    client = AsyncOpenAI(base_url=server.url("/v1"), api_key="sk-local", max_retries=0)
    async with client.realtime.connect(model="omniduplex") as conn:
        event = await asyncio.wait_for(conn.recv(), 10)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(conn.recv(), 10)
    return event


def test_a_backend_that_may_not_wait_gives_up_at_the_limit_and_leaves_nothing(ckpt):
    before = set(list_segments())
    backend = ProcessBackend(PipelineConfig(model=str(ckpt)), start_timeout_s=LIMIT_S)
    with pytest.raises(StageStartError, match="start limit: --start-timeout"):
        backend.start(lambda kind, msg: None)
    assert all(not p.is_alive() for p in backend.procs.values())
    assert not left_behind(before)


def test_an_abandoned_start_gives_up_at_once_and_leaves_nothing(ckpt):
    """``abandon_start`` (SIGTERM to ``serve`` while loading, :meth:`ServerState.stop`) from another thread,
    once the stage processes exist: a backend that would wait as long as they live raises at once."""
    before = set(list_segments())
    backend = ProcessBackend(PipelineConfig(model=str(ckpt)), start_timeout_s=600, wait_when_late=True)

    def abandon():
        while len(backend.procs) < len(backend.topo.all_stages):
            time.sleep(0.005)
        backend.abandon_start()

    thread = threading.Thread(target=abandon)
    thread.start()
    with pytest.raises(StageStartError, match=r"start abandoned \(the server is stopping\)"):
        backend.start(lambda kind, msg: None)
    thread.join()
    assert all(not p.is_alive() for p in backend.procs.values()) and not backend.up
    assert not left_behind(before)
    again = ProcessBackend(PipelineConfig(model=str(ckpt)))
    again.abandon_start()  # before the start: no stage process is spawned at all
    with pytest.raises(StageStartError, match="start abandoned"):
        again.start(lambda kind, msg: None)
    assert not again.procs
