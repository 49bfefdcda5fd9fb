"""Structured logs (``serve --log-json``) with session/turn context, and the stage stats reporter that keeps
an idle pipeline quiet."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from omniduplex.app.core.events import SessionStarted, UserTurnCommitted
from omniduplex.app.host import logs
from omniduplex.app.host.metrics import MeteredResponder, ServerMetrics
from omniduplex.app.host.state import ServerState
from omniduplex.app.server import ServerConfig
from omniduplex.pipeline.runtime.stage_stats import StatsReporter, worker_stats
from omniduplex.pipeline.stages.contract import BatchGauges, EngineGauges, StreamGauges


@pytest.fixture
def json_log():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream)
    yield stream
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in stream.getvalue().splitlines()]


def test_json_lines_carry_session_and_turn_ids_when_known(json_log):
    log = logging.getLogger("omniduplex.test")

    async def session_task():
        responder = MeteredResponder(object(), ServerMetrics(ServerState(ServerConfig())))
        responder.observe(SessionStarted("s7-abc"))
        log.info("opened %s", "s7-abc")
        responder.observe(UserTurnCommitted("s7-abc", turn_id="s7-abc-1"))
        await asyncio.create_task(asyncio.sleep(0))  # a child task inherits the context
        log.warning("turn")

    async def other_task():
        log.info("unrelated")

    async def main():
        await asyncio.gather(asyncio.create_task(session_task()), asyncio.create_task(other_task()))

    asyncio.run(main())
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"session_id": "given"})
    got = {x["message"]: x for x in lines(json_log)}
    assert set(got["opened s7-abc"]) == {"time", "level", "logger", "message", "session_id"}
    assert (
        got["opened s7-abc"]["session_id"] == "s7-abc" and got["opened s7-abc"]["logger"] == "omniduplex.test"
    )
    assert got["turn"]["turn_id"] == "s7-abc-1" and got["turn"]["level"] == "WARNING"
    assert "session_id" not in got["unrelated"]  # another task's context
    assert got["failed"]["session_id"] == "given" and "ValueError: boom" in got["failed"]["exc"]
    assert got["opened s7-abc"]["time"].endswith("+00:00")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_stats_reporter_is_quiet_when_idle_and_unchanged():
    sent, state, clock = [], {"batch_size": 0}, Clock()
    r = StatsReporter(lambda: dict(state), sent.append, every_s=1.0, clock=clock)
    r.tick(busy=False)
    assert sent == [{"batch_size": 0}]  # the first report always goes
    for t in (0.5, 1.0, 2.0, 3.0):  # idle, unchanged: nothing, however long
        clock.t = t
        r.tick(busy=False)
    assert len(sent) == 1
    state["batch_size"] = 2
    clock.t = 3.5
    r.tick(busy=True)  # not due yet
    clock.t = 4.0
    r.tick(busy=True)
    clock.t = 5.0
    r.tick(busy=True)  # busy: sent every period even if unchanged
    assert sent[1:] == [{"batch_size": 2}, {"batch_size": 2}]
    state["batch_size"] = 0
    clock.t = 6.0
    r.tick(busy=False)  # the change back to idle is reported once
    clock.t = 7.0
    r.tick(busy=False)
    assert sent[3:] == [{"batch_size": 0}]
    assert r.wait_s() == 1.0


def test_worker_stats_of_each_worker_kind():
    class Alloc:
        num_blocks, num_free = 64, 60

    class Sched:
        allocator, waiting, running = Alloc(), [1, 2], [3]

    class Engine:
        scheduler = Sched()

    class EngineWorker(EngineGauges):
        engine = Engine()

    class Batcher(BatchGauges):
        max_batch, pending = 4, list(range(6))

    class Streams(StreamGauges):
        streams = {"a": 1, "b": 2}

    assert worker_stats(EngineWorker()) == {
        "queue_depth": 2,
        "batch_size": 1,
        "kv_blocks_used": 4,
        "kv_blocks_free": 60,
    }
    assert worker_stats(Batcher()) == {"queue_depth": 2, "batch_size": 4}
    assert worker_stats(Streams()) == {"queue_depth": 0, "batch_size": 2}
