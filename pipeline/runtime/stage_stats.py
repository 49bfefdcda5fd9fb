"""Resource gauges of a stage: what its worker holds and what its relay edges lend out.

Read directly from the workers in-process (:class:`~.local_backend.LocalBackend`); a stage process sends
the same dicts to the orchestrator as ``stats`` messages on the status bus, through :class:`StatsReporter`
(about once a second while the stage is busy or its numbers changed, so an idle pipeline stays quiet).
"""

from __future__ import annotations

import time
from collections.abc import Callable

STATS_EVERY_S = 1.0
"""Period of a stage's ``stats`` messages while it is busy (s)."""


def worker_stats(worker) -> dict[str, int]:
    """Gauges of one stage worker, its :meth:`~.stages.contract.StageWorker.stats` (counts of requests and of
    16-token KV blocks).

    ``batch_size``: requests the next step works on (an engine's running requests, a batching worker's next
    batch, a streaming worker's open streams). ``queue_depth``: requests waiting beyond that batch.
    ``kv_blocks_used`` / ``kv_blocks_free``: the paged KV cache, for stages on the engine only.
    ``cuda_graph_hits`` / ``cuda_graph_misses``: steps (engine stages; the Talker's code predictor included)
    and pushes (Code2Wav) replayed as CUDA graphs / run eagerly, for stages that captured graphs only.
    ``spec_draft_tokens`` / ``spec_accepted_tokens``: speculative draft ids verified / kept, for engines
    that speculate only (:mod:`~omniduplex.pipeline.engine.speculative`).
    """
    return worker.stats()


def engine_stats(engine) -> dict[str, int]:
    """The :func:`worker_stats` gauges of a stage on our engine (:class:`~.engine.engine.Engine`)."""
    sched = engine.scheduler
    alloc = sched.allocator
    return {
        "queue_depth": len(sched.waiting),
        "batch_size": len(sched.running),
        "kv_blocks_used": alloc.num_blocks - alloc.num_free,
        "kv_blocks_free": alloc.num_free,
        **getattr(engine, "graph_stats", dict)(),
        **(engine.spec.stats() if getattr(engine, "spec", None) is not None else {}),
    }


def producer_stats(producer) -> dict[str, int]:
    """Credits of one relay edge, seen from its producer: ``slots`` in the pool, ``slots_in_use`` (lent to the
    consumer: written, not yet copied out) and ``inline_in_use`` (inline messages the consumer has not read).
    Reads the credits waiting in the producer's socket first."""
    producer.collect()
    return {
        "slots": producer.config.slots,
        "slots_in_use": producer.slots_in_use,
        "inline_in_use": producer.inline_in_use,
    }


class StatsReporter:
    """Sends ``snapshot()`` through ``send`` at most every ``every_s`` seconds, and only while ``busy`` or
    when the snapshot differs from the last one sent (the first one is always sent)."""

    def __init__(
        self,
        snapshot: Callable[[], dict],
        send: Callable[[dict], None],
        every_s: float = STATS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.snapshot, self.send, self.every_s, self.clock = snapshot, send, every_s, clock
        self.last: dict | None = None
        self.due = clock()

    def tick(self, busy: bool) -> None:
        """Call once per loop iteration (cheap when not due)."""
        now = self.clock()
        if now < self.due:
            return
        self.due = now + self.every_s
        snap = self.snapshot()
        if busy or snap != self.last:
            self.send(snap)
            self.last = snap

    def wait_s(self) -> float:
        """Seconds until the next report is due (≥ 0): the longest an idle loop should block."""
        return max(0.0, self.due - self.clock())
