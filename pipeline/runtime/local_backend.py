"""All stage workers in one background thread: the in-process backend (tests, debugging).

Same routing as the multi-process backend (:mod:`.topology`), no relay.
"""

from __future__ import annotations

import threading
import traceback
from collections import deque

from omniduplex.pipeline.messages import StageError, StageMessage, goes_downstream
from omniduplex.pipeline.orchestrator import OutputCallback
from omniduplex.pipeline.runtime.stage_stats import worker_stats
from omniduplex.pipeline.stages.contract import StageWorker
from omniduplex.pipeline.stages.kinds import STAGE_KINDS
from omniduplex.pipeline.topology import SHAPES, Topology, with_side_asr


class LocalBackend:
    """Runs ``workers`` (stage name → worker, as :func:`.graph.build_all` builds them) round-robin in a
    daemon thread, routed by ``topo`` (default: the graph shape whose stages they are, with the side ASR
    when an ``asr`` worker comes with a speech-LM shape).

    Raises:
        ValueError: the worker names are not the stages of one graph shape.
    """

    def __init__(self, workers: dict[str, StageWorker], topo: Topology | None = None) -> None:
        self.workers = workers
        if topo is None:
            shapes = list(SHAPES) + [with_side_asr(t) for t in SHAPES]
            found = [t for t in shapes if set(t.all_stages) == set(workers)]
            if not found:
                raise ValueError(f"workers {sorted(workers)} are not the stages of a known graph shape")
            topo = found[0]
        elif set(topo.all_stages) != set(workers):
            raise ValueError(f"workers {sorted(workers)} are not the stages of graph {topo.name}")
        self.topo = topo
        self.inbox: deque[tuple[str, object]] = deque()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.running = False
        self.owner: dict[str, set[str]] = {
            s: set() for s in self.topo.all_stages
        }  # request ids each stage holds

    def start(self, on_output: OutputCallback) -> None:
        self.on_output, self.running = on_output, True
        self.thread = threading.Thread(target=self._loop, name="omniduplex-local-backend", daemon=True)
        self.thread.start()

    def send(self, msg: StageMessage) -> None:
        self.inbox.append(("submit", msg))
        self.wake.set()

    def abort(self, request_id: str) -> None:
        self.inbox.append(("abort", request_id))
        self.wake.set()

    @property
    def ready(self) -> bool:
        """The workers are built before the backend, so it is ready as soon as it runs."""
        return self.running

    def stats(self) -> dict:
        """Pipeline gauges shaped as :meth:`.process_backend.ProcessBackend.stats` returns them, read from the
        workers directly (no relay edges, no restarts)."""
        return {
            "stages": {s: worker_stats(w) for s, w in self.workers.items()},
            "edges": {},
            "restarts": {s: 0 for s in self.workers},
            "up": {s: self.running for s in self.workers},
        }

    def stop(self) -> None:
        """Stop the thread, then close the workers that hold resources of their own (vLLM's engine)."""
        self.running = False
        self.wake.set()
        if self.thread:
            self.thread.join(timeout=10)
        for w in self.workers.values():
            w.close()

    def _deliver(self, stage: str, msg: StageMessage) -> None:
        try:
            self.workers[stage].submit(msg)
            self.owner[stage].add(msg.request_id)
        except Exception as e:  # bad input for this request only
            self._fail(msg.request_id, f"{stage}: {e}", stage)

    def _fail(self, request_id: str, error: str, stage: str | None = None) -> None:
        for s in self.topo.all_stages:
            self.workers[s].abort(request_id)
            self.owner[s].discard(request_id)
        self.on_output(StageMessage(request_id, {}, StageError(error=error, stage=stage), last=True))

    def _loop(self) -> None:
        while self.running:
            while self.inbox:
                kind, item = self.inbox.popleft()
                if kind == "submit":
                    for s in self.topo.entry_stages:
                        self._deliver(s, item)
                else:
                    for s in self.topo.all_stages:
                        self.workers[s].abort(item)
                        self.owner[s].discard(item)
            progressed = False
            for stage in self.topo.all_stages:
                w = self.workers[stage]
                if not w.has_work():
                    continue
                progressed = True
                try:
                    outs = w.step()
                except Exception:
                    err = traceback.format_exc(limit=3)
                    for rid in list(self.owner[stage]):
                        self._fail(rid, f"{stage} failed: {err}", stage)
                    continue
                for rid, error in w.pop_errors():
                    self._fail(rid, f"{stage}: {error}", stage)
                kind = STAGE_KINDS[stage]
                for msg in outs:
                    if (error := kind.check_output(msg)) is not None:  # the wrong kind fails its turn only
                        self._fail(msg.request_id, error, stage)
                        continue
                    if msg.last:
                        self.owner[stage].discard(msg.request_id)
                    if stage in self.topo.to_orchestrator:
                        self.on_output(msg)
                    nxt = self.topo.downstream(stage)
                    if nxt and goes_downstream(msg):
                        self._deliver(nxt, msg)
            if not progressed:
                self.wake.wait(1.0)  # send, abort and stop set it
                self.wake.clear()
