"""Barge-in as LiveKit sends it: livekit-agents' own OpenAI realtime plugin (``livekit-plugins-openai``
``RealtimeModel(base_url=...)``, what LiveKit users run) against our ``/v1/realtime`` server.

The server runs in-process on a scripted responder (no models: the reply's text, audio and text↔audio
alignment are fixed, so the kept text is known exactly). The reply's text has a blank line between two
clauses, as LLMs write it; the TTS chunks carry each clause cleaned (whitespace collapsed). Three orders of
events, each answered without an ``error`` event and leaving exactly the played prefix of the generated
text in the server's history:

1. ``interrupt()`` then ``truncate()`` at once (what ``AgentSession`` does on a barge-in): the truncate
   reaches the server before the cancelled reply's ``response.done``;
2. ``truncate()`` alone while the reply plays (the server stops it, then truncates);
3. ``truncate()`` after ``response.done`` (the reply had played to its end).
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

pytest.importorskip("livekit.plugins.openai")

from livekit.plugins.openai.realtime import RealtimeModel  # noqa: E402
from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad  # noqa: E402

from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta  # noqa: E402
from omniduplex.app.server import ServerConfig, create_app  # noqa: E402
from omniduplex.benchmarks.local_server import LocalServer  # noqa: E402

RATE = 24_000
TEXT = "A brave cat... (laughs)\n\nIn the past, there lived a cat. **She** was brave."
CLAUSES = [
    ("A brave cat... (laughs)", 0.6),
    ("In the past, there lived a cat.", 1.0),
    ("She was brave.", 0.8),
]
"""The TTS chunks: the words each speaks (cleaned, as the cascade's clause splitter emits them) and its
length in seconds; 0.6 + 1.0 + 0.8 = 2.4 s of reply audio."""


class StoryResponder:
    """Every reply is :data:`TEXT` with :data:`CLAUSES` as its audio, all produced at once (the server's
    playout paces it); ``cancel`` ends the stream with ``ReplyFailed("cancelled")``."""

    output_rate = RATE

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue] = {}

    def start(self, turn_id, waveform, history, options=None):
        q = self.queues[turn_id] = asyncio.Queue()
        for i, piece in enumerate(TEXT.split(" ")):
            q.put_nowait(ReplyTextDelta(piece if i == 0 else " " + piece))
        for said, seconds in CLAUSES:
            t = np.arange(int(seconds * RATE)) / RATE
            q.put_nowait(ReplyAudioChunk((0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), said))
        q.put_nowait(ReplyDone())

    async def events(self, turn_id):
        q = self.queues[turn_id]
        while True:
            ev = await q.get()
            yield ev
            if isinstance(ev, ReplyDone | ReplyFailed):
                return

    def cancel(self, turn_id):
        q = self.queues[turn_id]
        while not q.empty():
            q.get_nowait()
        q.put_nowait(ReplyFailed("cancelled"))


@pytest.fixture(scope="module")
def server():
    with LocalServer(create_app(ServerConfig(max_sessions=4), responder=StoryResponder())) as srv:
        yield srv


async def _reply(srv: LocalServer, order: str, audio_end_ms: int, wait_for_ms: int) -> tuple:
    """One reply through the plugin: wait until ``wait_for_ms`` of its audio arrived (or, for ``after_done``,
    until ``response.done``), truncate in the given ``order``; returns the server's view of the reply and
    the server events the plugin received."""
    model = RealtimeModel(
        base_url=srv.url("/v1"), api_key="sk-local", turn_detection=ServerVad(type="server_vad")
    )
    rt = model.session()
    server_events, errors, received_ms = [], [], [0.0]
    truncated, done = asyncio.Event(), asyncio.Event()

    def on_server_event(e: dict) -> None:
        server_events.append(e)
        if e["type"] == "conversation.item.truncated":
            truncated.set()
        elif e["type"] == "response.done":
            done.set()

    rt.on("openai_server_event_received", on_server_event)
    rt.on("error", errors.append)
    messages: asyncio.Queue = asyncio.Queue()

    async def drain(gen) -> None:
        async for msg in gen.message_stream:
            messages.put_nowait(msg)
            async for frame in msg.audio_stream:
                received_ms[0] += 1000.0 * frame.samples_per_channel / frame.sample_rate

    tasks = []
    rt.on("generation_created", lambda gen: tasks.append(asyncio.create_task(drain(gen))))
    try:
        await asyncio.wait_for(rt.generate_reply(instructions="Tell me a story."), 30)
        msg = await asyncio.wait_for(messages.get(), 30)
        if order == "after_done":
            await asyncio.wait_for(done.wait(), 30)
        else:
            async with asyncio.timeout(30):
                while received_ms[0] < wait_for_ms:
                    await asyncio.sleep(0.01)
            if order == "interrupt_then_truncate":
                rt.interrupt()  # response.cancel, then at once:
        rt.truncate(message_id=msg.message_id, modalities=["audio"], audio_end_ms=audio_end_ms)
        await asyncio.wait_for(truncated.wait(), 30)
        await asyncio.wait_for(done.wait(), 30)
        call = next(c for c in list(srv.state.sessions.values()) if msg.message_id in c.conn.items)
        turn_id = call.conn.items[msg.message_id][0]
        record = call.session.reply_record(turn_id)
        history = call.session.history.snapshot()
        errors += [e for e in server_events if e["type"] == "error"]
    finally:
        await rt.aclose()
        for t in tasks:
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        await model.aclose()
    types = [e["type"] for e in server_events]
    return record, history, types, errors


@pytest.mark.parametrize(
    "order, audio_end_ms, wait_for_ms, kept",
    [
        # half of clause 2 played: "In the past, the|re" is cut back to the last whole word
        ("interrupt_then_truncate", 1100, 1200, "A brave cat... (laughs)\n\nIn the past,"),
        # the end of clause 2: the blank line between the clauses is kept as generated
        ("truncate_alone", 1600, 1700, "A brave cat... (laughs)\n\nIn the past, there lived a cat."),
        # the whole reply played, then the client says only clause 1 was heard
        ("after_done", 600, 0, "A brave cat... (laughs)"),
    ],
)
def test_livekit_openai_plugin_truncate_keeps_the_played_prefix_in_any_order(
    server, order, audio_end_ms, wait_for_ms, kept
):
    record, history, types, errors = asyncio.run(_reply(server, order, audio_end_ms, wait_for_ms))
    assert not errors, errors
    assert record.text == TEXT and record.kept == kept and TEXT.startswith(record.kept)
    assert history[-1] == ["assistant", kept]
    assert "conversation.item.truncated" in types and types.count("response.done") == 1
    if order == "after_done":
        assert types.index("response.done") < types.index("conversation.item.truncated")
    else:  # the truncate stopped the reply (or found it stopping): its audio ended early
        assert record.played_ms == audio_end_ms and record.generated_ms == pytest.approx(2400, abs=1)
