"""Prometheus metrics of ``omniduplex serve`` (``GET /metrics``), on a registry of each app's own.

Latencies are in seconds (Prometheus convention). Histograms:

- ``omniduplex_ttfp_seconds``: user turn committed → first reply audio sent (session event
  ``ReplyAudioStarted.commit_to_audio_ms``);
- ``omniduplex_e2el_seconds``: turn submitted → last reply audio out of the pipeline (its ``e2el_ms``);
- ``omniduplex_barge_in_stop_seconds``: barge-in detected → first frame without reply audio
  (``ReplyEnded.stop_ms``).

Counters: ``omniduplex_turns_total`` (user turns committed), ``omniduplex_replies_total{reason}``
(completed, interrupted, error, closed), ``omniduplex_stage_restarts_total{stage}`` (after a crash),
``omniduplex_tool_calls_total{tool,outcome}`` (server-run tool calls, ``ok`` / ``failed``) with their latency
``omniduplex_tool_call_seconds{tool}`` (:mod:`.tools.runner`), ``omniduplex_failed_turns_total{stage}``
(pipeline requests of any surface that ended in an error, not a cancel, by the stage that failed them:
``ReplyFailed.stage``; ``orchestrator`` when reading an output failed, ``unknown`` when none is named).

Gauges: ``omniduplex_sessions`` / ``omniduplex_max_sessions`` (every surface), ``omniduplex_turns_in_flight``;
per stage ``omniduplex_stage_up``, ``..._queue_depth`` (requests waiting beyond the next batch),
``..._batch_size`` (requests in the next step), ``..._kv_blocks_used`` / ``..._kv_blocks_free`` (16-token
blocks, engine stages only), ``..._cuda_graph_hits`` / ``..._cuda_graph_misses`` (steps replayed as CUDA
graphs / run eagerly, since the start; stages on a GPU that captured graphs); per relay edge
``omniduplex_relay_slots``, ``..._slots_in_use`` (lent to the consumer, credits not yet back) and
``..._inline_in_use`` (inline messages not yet credited).

Stage gauges come from the backend's ``stats()`` (a stage process reports them about once a second while
busy, :mod:`omniduplex.pipeline.runtime.stage_stats`). Session events reach
:meth:`ServerMetrics.observe` through
:class:`MeteredResponder`, the wrapper the server puts around its responder.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from omniduplex.app.core.events import ReplyAudioStarted, ReplyEnded, SessionEvent, UserTurnCommitted
from omniduplex.app.core.replies import ReplyDone, ReplyEvent, ReplyFailed, Responder
from omniduplex.app.host import logs

CONTENT_TYPE = CONTENT_TYPE_LATEST
TTFP_BUCKETS_S = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
E2EL_BUCKETS_S = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0)
TOOL_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)
STOP_BUCKETS_S = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
STAGE_GAUGES = {
    "queue_depth": "Requests waiting beyond the stage's next batch.",
    "batch_size": "Requests in the stage's next step.",
    "kv_blocks_used": "Paged KV cache blocks in use (16 tokens each).",
    "kv_blocks_free": "Paged KV cache blocks free (16 tokens each).",
    "cuda_graph_hits": "Steps or pushes of the stage replayed as CUDA graphs (stages that captured some).",
    "cuda_graph_misses": "Steps or pushes with no CUDA graph, run eagerly (stages that captured some).",
}
EDGE_GAUGES = {
    "slots": "Shared-memory slots of the relay edge.",
    "slots_in_use": "Relay slots lent to the consumer (credits not yet returned).",
    "inline_in_use": "Inline relay messages whose credits are not yet returned.",
}


def pipeline_stats(orchestrator) -> dict | None:
    """The backend's ``stats()`` (``stages``, ``edges``, ``restarts``, ``up``), or ``None`` without one."""
    stats = getattr(getattr(orchestrator, "backend", None), "stats", None)
    return stats() if callable(stats) else None


class ServerMetrics:
    """The metrics of one server (``state``: its :class:`~.state.ServerState`)."""

    def __init__(self, state) -> None:
        self.state = state
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttfp = Histogram(
            "omniduplex_ttfp_seconds",
            "User turn committed to first reply audio sent.",
            buckets=TTFP_BUCKETS_S,
            registry=r,
        )
        self.e2el = Histogram(
            "omniduplex_e2el_seconds",
            "Turn submitted to last reply audio out of the pipeline.",
            buckets=E2EL_BUCKETS_S,
            registry=r,
        )
        self.stop = Histogram(
            "omniduplex_barge_in_stop_seconds",
            "Barge-in detected to first frame without reply audio.",
            buckets=STOP_BUCKETS_S,
            registry=r,
        )
        self.turns = Counter("omniduplex_turns", "User turns committed.", registry=r)
        self.replies = Counter("omniduplex_replies", "Replies ended, by reason.", ["reason"], registry=r)
        self.tool_calls = Counter(
            "omniduplex_tool_calls", "Server-run tool calls, by outcome.", ["tool", "outcome"], registry=r
        )
        self.tool_seconds = Histogram(
            "omniduplex_tool_call_seconds", "Server-run tool call latency.", ["tool"], buckets=TOOL_BUCKETS_S,
            registry=r,
        )
        self.failed_turns = Counter(
            "omniduplex_failed_turns",
            "Pipeline requests that failed, by the stage that failed them.",
            ["stage"],
            registry=r,
        )
        r.register(_StateCollector(state))

    def observe_failed(self, ev: ReplyFailed) -> None:
        """Count a failed pipeline request under its stage (a cancel is no failure)."""
        if ev.error != "cancelled":
            self.failed_turns.labels(ev.stage or "unknown").inc()

    def observe_tool(self, tool: str, ok: bool, latency_s: float) -> None:
        """Count one server-run call of ``tool`` and its latency (s)."""
        self.tool_calls.labels(tool, "ok" if ok else "failed").inc()
        self.tool_seconds.labels(tool).observe(latency_s)

    def observe(self, ev: SessionEvent) -> None:
        """Record what a session event measures (any session of this server)."""
        if isinstance(ev, ReplyAudioStarted):
            self.ttfp.observe(ev.commit_to_audio_ms / 1000.0)
        elif isinstance(ev, ReplyEnded):
            self.replies.labels(ev.reason).inc()
            if ev.stop_ms is not None:
                self.stop.observe(ev.stop_ms / 1000.0)
        elif isinstance(ev, UserTurnCommitted):
            self.turns.inc()

    def render(self) -> bytes:
        """The Prometheus text exposition (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class _StateCollector:
    """Gauges and restart counters read from the server state at scrape time."""

    def __init__(self, state) -> None:
        self.state = state

    def describe(self) -> list:
        return []  # names are not known before the pipeline runs; no duplicate check needed

    def collect(self):
        st = self.state
        gauge = GaugeMetricFamily
        yield gauge("omniduplex_sessions", "Open sessions (every surface).", value=len(st.sessions))
        yield gauge("omniduplex_max_sessions", "Session limit.", value=st.cfg.max_sessions)
        turns = getattr(st.orchestrator, "turns", None)
        yield gauge("omniduplex_turns_in_flight", "Turns in the pipeline.", value=len(turns or ()))
        stats = pipeline_stats(st.orchestrator)
        if not stats:
            return
        up = gauge("omniduplex_stage_up", "1 when the stage is running and ready.", labels=["stage"])
        for stage, ok in stats.get("up", {}).items():
            up.add_metric([stage], float(ok))
        yield up
        restarts = CounterMetricFamily(
            "omniduplex_stage_restarts", "Stage processes restarted after a crash.", labels=["stage"]
        )
        for stage, n in stats.get("restarts", {}).items():
            restarts.add_metric([stage], n)
        yield restarts
        yield from _families("omniduplex_stage_", STAGE_GAUGES, "stage", stats.get("stages", {}))
        yield from _families("omniduplex_relay_", EDGE_GAUGES, "edge", stats.get("edges", {}))


def _families(prefix: str, gauges: dict[str, str], label: str, rows: dict[str, dict]):
    for key, doc in gauges.items():
        fam = GaugeMetricFamily(prefix + key, doc, labels=[label])
        for name, values in sorted(rows.items()):
            if key in values:
                fam.add_metric([name], values[key])
        yield fam


class MeteredResponder:
    """A :class:`~omniduplex.app.core.replies.Responder` that records metrics and log context on the way.

    Sessions call :meth:`observe` with each of their events (``Session.emit``); :meth:`events` records the
    pipeline's E2EL of each completed reply, counts each failed one (:meth:`ServerMetrics.observe_failed`)
    and tags the consuming task's log records with the turn id. Anything else is the wrapped responder's.
    """

    def __init__(self, inner: Responder, metrics: ServerMetrics) -> None:
        self.inner, self.metrics = inner, metrics

    @property
    def output_rate(self) -> int:
        return self.inner.output_rate

    def start(
        self, turn_id: str, waveform: np.ndarray, history: list[list[str]], options: dict | None = None
    ) -> None:
        self.inner.start(turn_id, waveform, history, options)

    async def events(self, turn_id: str) -> AsyncIterator[ReplyEvent]:
        logs.bind(turn_id=turn_id)
        stream = self.inner.events(turn_id)
        try:
            async for ev in stream:
                if isinstance(ev, ReplyDone) and "e2el_ms" in ev.metrics:
                    self.metrics.e2el.observe(float(ev.metrics["e2el_ms"]) / 1000.0)
                elif isinstance(ev, ReplyFailed):
                    self.metrics.observe_failed(ev)
                yield ev
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def cancel(self, turn_id: str) -> None:
        self.inner.cancel(turn_id)

    def observe(self, ev: SessionEvent) -> None:
        """One session event: metrics, and the ids it carries as log context of the emitting task."""
        self.metrics.observe(ev)
        logs.bind_event(ev)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)
