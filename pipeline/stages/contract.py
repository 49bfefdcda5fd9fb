"""The stage contract: what every stage worker offers the stage loop (in-process or a stage process).

A worker is fed its input edge's messages (:meth:`StageWorker.submit`), stepped while it has work
(:meth:`StageWorker.step`, whose messages go downstream and/or to the orchestrator by the
:class:`~..topology.Topology`), told to drop a request anywhere in its life (:meth:`StageWorker.abort`), and
read for its gauges (:meth:`StageWorker.stats`). :class:`WorkerBase` gives the members most workers need
no code for; the ``*Gauges`` bases give the three shapes of gauges (engine, batch of whole turns, open
streams). ``tests/test_stage_contract.py`` checks every worker class the graphs build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from omniduplex.pipeline.messages import StageMessage

if TYPE_CHECKING:
    from omniduplex.pipeline.engine.engine import Engine


@runtime_checkable
class StageWorker(Protocol):
    """One pipeline stage's logic, independent of how messages reach it."""

    def submit(self, msg: StageMessage) -> None:
        """Take one message of the input edge. Raises ``ValueError`` (or any exception) for bad input: the
        stage loop then fails that request only."""

    def abort(self, request_id: str) -> None:
        """Forget ``request_id`` (free its KV blocks, streams, pending input); no-op when unknown."""

    def has_work(self) -> bool:
        """Whether :meth:`step` would make progress now."""

    def step(self) -> list[StageMessage]:
        """One batch of work; the messages it produced (``last`` closes a request on the output edge)."""

    def stats(self) -> dict[str, int]:
        """Gauges: ``queue_depth``, ``batch_size`` and, where they apply, ``kv_blocks_used`` /
        ``kv_blocks_free`` and ``cuda_graph_hits`` / ``cuda_graph_misses`` (:mod:`..stage_stats`)."""

    def pop_errors(self) -> list[tuple[str, str]]:
        """``(request_id, error)`` of requests the worker failed on its own since the last call (an
        engine of its own: vLLM, a remote server); the stage loop fails each of those turns."""

    def close(self) -> None:
        """Release resources of the worker's own when the stage stops (engine processes, clients)."""


class WorkerBase:
    """Defaults of :class:`StageWorker`'s members a worker without engine of its own needs no code for."""

    def pop_errors(self) -> list[tuple[str, str]]:
        """No failures of its own: a step that raises fails the stage's requests instead."""
        return []

    def close(self) -> None:
        """Nothing of its own to release."""


class EngineGauges(WorkerBase):
    """Gauges of a worker on our engine (``self.engine``: :class:`~..engine.engine.Engine`), and its work."""

    engine: Engine

    def has_work(self) -> bool:
        """Requests in flight on ``self.engine``."""
        return self.engine.has_unfinished()

    def stats(self) -> dict[str, int]:
        """:func:`~..stage_stats.engine_stats` of ``self.engine``."""
        from omniduplex.pipeline.runtime.stage_stats import engine_stats

        stats: dict[str, int] = engine_stats(self.engine)
        return stats


class BatchGauges(WorkerBase):
    """Gauges of a worker that batches whole turns (``self.pending``, at most ``self.max_batch`` a step)."""

    pending: list[Any]
    max_batch: int

    def stats(self) -> dict[str, int]:
        """``batch_size``: the next step's batch; ``queue_depth``: the turns waiting beyond it."""
        cap = max(1, int(self.max_batch))
        return {"queue_depth": max(0, len(self.pending) - cap), "batch_size": min(len(self.pending), cap)}


class StreamGauges(WorkerBase):
    """Gauges of a worker that keeps one open stream a request (``self.streams``)."""

    streams: dict[str, Any]

    def stats(self) -> dict[str, int]:
        """``batch_size``: the open streams (each step advances all of them)."""
        return {"queue_depth": 0, "batch_size": len(self.streams)}
