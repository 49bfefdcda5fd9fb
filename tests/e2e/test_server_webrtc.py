"""The server over real WebRTC (aiortc clients on this machine) with the real in-process pipeline:
session limit, a client that vanishes mid-turn, 20 sessions opened and dropped without leaks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soxr

from omniduplex.app.core.session import SessionConfig
from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.webrtc_client import VoiceClient
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.pipeline.audio_io import load_audio

pytestmark = pytest.mark.slow
QUESTION = Path(__file__).parents[2] / "examples" / "question.wav"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=3))


@pytest.fixture(scope="module")
def unified_ckpt(tmp_path_factory):
    """A tiny unified checkpoint whose stream-0 audio EOS logit is always 0 (its head row zeroed), so a
    reply runs to its frame budget instead of stopping wherever the random weights say."""
    from safetensors.torch import load_file, save_file

    from omniduplex.models.unified.model import UnifiedConfig
    from omniduplex.models.unified.presets import unified_config, write_unified_checkpoint

    d = write_unified_checkpoint(tmp_path_factory.mktemp("unified"), "tiny", seed=3)
    tensors = load_file(d / "model.safetensors")
    tensors["lm_head.weight"][UnifiedConfig.from_dict(unified_config("tiny")).audio_eos_id(0)] = 0.0
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return str(d)


@pytest.fixture(scope="module")
def speech():
    """The spoken question at 48 kHz, then 1.5 s of silence (endpointing commits the turn)."""
    q = soxr.resample(load_audio(QUESTION), 16000, 48000).astype(np.float32)
    return np.concatenate([np.zeros(24000, np.float32), q, np.zeros(72000, np.float32)])


def config(ckpt: str, max_sessions: int, **kw) -> ServerConfig:
    return ServerConfig(
        max_sessions=max_sessions,
        session=SessionConfig(turn=TurnConfig(endpoint_ms=400)),
        model=ckpt,
        processes=False,
        max_tokens=24,
        # 12 s of Code2Wav reply, never cut short by a sampled codec EOS: still playing when the client
        # goes away
        **{"talker_max_tokens": 150, "ignore_eos": True, **kw},
    )


async def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached after {timeout} s")
        await asyncio.sleep(0.05)


def pipeline_idle(state) -> bool:
    p = state.metrics()["pipeline"]
    stages = [v for v in p.values() if isinstance(v, dict)]
    assert len(stages) >= 3  # every stage of the graph reports
    return (
        p["turns_in_flight"] == 0
        and all(
            v["kv_blocks_free"] == v["kv_blocks_total"] and not v["unfinished"]
            for v in stages
            if "kv_blocks_free" in v
        )
        and all(v.get("streams", 0) == 0 and v.get("pending", 0) == 0 for v in stages)
    )


def other_tasks(baseline: set) -> set:
    return {t for t in asyncio.all_tasks() if t not in baseline and t is not asyncio.current_task()}


async def connect(http: httpx.AsyncClient, pcm: np.ndarray) -> tuple[VoiceClient, httpx.Response]:
    client = VoiceClient(pcm)
    r = await http.post("/offer", json=await client.offer())
    if r.status_code == 200:
        await client.accept(r.json())
    return client, r


def run_server(cfg: ServerConfig, body):
    """Run ``body(state, http)`` against the app (lifespan started) in one event loop."""

    async def main():
        app = create_app(cfg)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as http:
                return await body(app.state.server, http)

    return asyncio.run(main())


def test_session_limit_refuses_with_503_and_frees_the_slot_on_hang_up(ckpt, speech):
    async def body(state, http):
        first, r1 = await connect(http, speech)
        second, r2 = await connect(http, speech)
        await second.close()
        assert r1.status_code == 200 and r2.status_code == 503
        assert "full" in r2.json()["error"] and r2.json()["max_sessions"] == 1
        await first.wait_for("session_started", 15)
        await first.close()  # DTLS close → the server closes the session
        await until(lambda: not state.sessions, 15, "session freed after hang-up")
        third, r3 = await connect(http, speech)
        assert r3.status_code == 200
        await third.wait_for("session_started", 15)
        assert (await http.delete(f"/sessions/{third.session_id}")).status_code == 200
        assert state.sessions == {}
        await third.close()

    run_server(config(ckpt, 1), body)


@pytest.mark.parametrize("shape", ["qwen3-omni", "unified"])
def test_client_vanishing_mid_turn_cancels_the_turn_and_frees_everything(ckpt, unified_ckpt, speech, shape):
    model = ckpt if shape == "qwen3-omni" else unified_ckpt

    async def body(state, http):
        baseline = set(asyncio.all_tasks())
        cancelled, cancel = [], state.responder.cancel
        state.responder.cancel = lambda turn_id: (cancelled.append(turn_id), cancel(turn_id))
        client, r = await connect(http, speech)
        assert r.status_code == 200
        committed = await client.wait_for("user_turn_committed", 30)
        await client.wait_for("reply_audio_started", 30)
        await until(lambda: client.nonzero_frames > 5, 15, "reply audio received")
        peer = state.sessions[client.session_id]
        client.mic.vanish()  # no more packets and no goodbye
        await until(lambda: not state.sessions, 15, "vanished session closed by the media timeout")
        await until(lambda: pipeline_idle(state), 10, "pipeline resources freed")
        await client.close()
        await until(lambda: not other_tasks(baseline), 10, "no tasks left behind")
        return committed, cancelled, peer

    # unified: 1200 frames ≈ 14 s of 44.1 kHz DAC audio, still playing when the client goes away
    extra = {"talker_max_tokens": 1200} if shape == "unified" else {}
    committed, cancelled, peer = run_server(config(model, 2, media_timeout_s=1.0, **extra), body)
    assert committed["audio_ms"] > 3000  # the whole spoken question
    # the 12 s reply was cut off in the pipeline; any earlier cancel was a preemptive reply to the question so
    # far, dropped when the speaker went on after a pause
    assert cancelled[-1] == committed["turn_id"] and committed["turn_id"] not in cancelled[:-1]
    assert peer.session.closed and peer.session.reply_turn_id is None and peer.pc.connectionState == "closed"


def test_twenty_sessions_opened_and_dropped_leak_no_tasks_or_kv_blocks(ckpt, speech):
    async def body(state, http):
        baseline = set(asyncio.all_tasks())
        clients = []
        for batch in range(2):  # 2 × 10 concurrent sessions
            opened = await asyncio.gather(*(connect(http, speech) for _ in range(10)))
            assert [r.status_code for _, r in opened] == [200] * 10
            batch_clients = [c for c, _ in opened]
            clients += batch_clients
            # let the turns start on some of them, then drop all: half hang up, half vanish
            await until(
                lambda bc=batch_clients: sum("user_turn_committed" in c.kinds() for c in bc) >= 3,
                40,
                "turns committed",
            )
            for i, c in enumerate(batch_clients):
                if i % 2:
                    c.mic.vanish()
                else:
                    await c.close()
            await until(lambda: not state.sessions, 20, f"batch {batch} sessions closed")
        await until(lambda: pipeline_idle(state), 15, "pipeline resources freed")
        for c in clients:
            await c.close()
        await until(lambda: not other_tasks(baseline), 15, "no tasks left behind")
        return state.metrics(), clients

    metrics, clients = run_server(config(ckpt, 10, media_timeout_s=1.0), body)
    assert metrics["sessions"] == 0 and metrics["sessions_started"] == 20
    assert metrics["turns"] >= 6
    assert metrics["pipeline"]["turns_in_flight"] == 0
