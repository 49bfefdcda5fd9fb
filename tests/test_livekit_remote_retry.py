"""The remote plugin when its omniduplex server is down, comes up, restarts mid-reply, or never comes back:
the AgentSession gets one recoverable ``error`` per outage, nothing waits on a dead socket, the link
reconnects with backoff and the conversation goes on; after the give-up time the error is unrecoverable and
the AgentSession closes. The servers run a scripted pipeline (the real one:
tests/e2e/test_livekit_remote.py)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

pytest.importorskip("livekit.agents")

import uvicorn  # noqa: E402
from livekit.agents import Agent, AgentSession, APIConnectionError, llm  # noqa: E402
from livekit_io import MicInput, SpeakerOutput  # noqa: E402
from livekit_scripted import ScriptedPipeline  # noqa: E402

from omniduplex.app.server import ServerConfig, create_app  # noqa: E402
from omniduplex.app.surfaces.livekit.remote import RemoteOptions, RemoteRealtimeModel  # noqa: E402
from omniduplex.app.surfaces.livekit.remote_link import RetryPolicy  # noqa: E402

FAST = RetryPolicy(initial_s=0.1, max_delay_s=0.4, give_up_after_s=None, connect_timeout_s=3.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``omniduplex serve``'s app on a scripted pipeline, in a uvicorn thread."""

    def __init__(self, port: int) -> None:
        self.pipeline = ScriptedPipeline(step_s=0.2)
        app = create_app(ServerConfig(), responder=self.pipeline)
        cfg = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def __aenter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            assert self.thread.is_alive(), "server did not start"
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 10)


async def until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_server_down_then_up_then_restarting_mid_reply():
    port = free_port()

    async def main():
        model = RemoteRealtimeModel(RemoteOptions(url=f"ws://127.0.0.1:{port}/v1/realtime", retry=FAST))
        session = AgentSession(llm=model, aec_warmup_duration=None)
        session.input.audio, session.output.audio = MicInput(), SpeakerOutput()
        errors, reconnects = [], []
        session.on("error", lambda ev: errors.append(ev.error))
        await session.start(Agent(instructions="You count."))
        rt = next(iter(model.sessions))
        rt.on("session_reconnected", lambda ev: reconnects.append(ev))
        await until(lambda: rt.link.attempts >= 3)  # down: retried with backoff
        down = list(errors)
        t = time.monotonic()
        await asyncio.wait_for(session.generate_reply(instructions="hi"), 10)  # fails fast, no hang
        failed_reply_s = time.monotonic() - t
        async with Server(port) as first:  # up: connects, a reply plays
            await until(lambda: rt.link.connected)
            await asyncio.wait_for(session.generate_reply(instructions="Count."), 30)
            handle = session.generate_reply(instructions="Count again.")
            await until(lambda: session.agent_state == "speaking")
        # the server stopped mid-reply: the reply ends, one more recoverable error
        await asyncio.wait_for(handle, 10)
        outage = len(errors)
        async with Server(port) as second:  # back: reconnects, the conversation is re-sent
            await until(lambda: reconnects)
            await asyncio.wait_for(session.generate_reply(user_input="And now?"), 30)
        await session.aclose()
        return rt, down, errors, outage, failed_reply_s, first, second

    rt, down, errors, outage, failed_reply_s, first, second = asyncio.run(main())
    assert len(down) == 1  # one error per outage, however many attempts
    assert isinstance(down[0], llm.RealtimeModelError) and down[0].recoverable
    assert isinstance(down[0].error, APIConnectionError) and str(port) in str(down[0].error)
    assert failed_reply_s < 2.0
    assert outage == 2 and all(e.recoverable for e in errors)
    assert len(first.pipeline.started) == 2 and first.pipeline.started[1][0] in first.pipeline.cancelled
    # the restarted server got the instructions and the conversation so far with the next turn
    (_, history, options) = second.pipeline.started[-1]
    assert options["system_prompt"] == "You count." and options["user_text"] == "And now?"
    assert history and history[0][0] == "assistant" and history[0][1].startswith("one two")
    assert rt.link.connections == 2


def test_server_that_never_comes_back_closes_the_agent_session():
    port = free_port()
    policy = RetryPolicy(initial_s=0.1, max_delay_s=0.2, give_up_after_s=1.0, connect_timeout_s=1.0)

    async def main():
        model = RemoteRealtimeModel(RemoteOptions(url=f"ws://127.0.0.1:{port}/v1/realtime", retry=policy))
        session = AgentSession(llm=model, aec_warmup_duration=None)
        session.input.audio, session.output.audio = MicInput(), SpeakerOutput()
        closed, errors = asyncio.Event(), []
        session.on("error", lambda ev: errors.append(ev.error))
        session.on("close", lambda ev: closed.set())
        await session.start(Agent(instructions="You count."))
        await asyncio.wait_for(closed.wait(), 15)
        return errors

    errors = asyncio.run(main())
    assert errors[0].recoverable and not errors[-1].recoverable
    assert "down for" in str(errors[-1].error)
