"""The main loop of one stage process: receive on the input edge, step the worker, send downstream.

Wiring (all ``ipc://`` under one run directory): each edge's producer binds, its consumer connects
(the relay). A control bus (ZMQ PUB → SUB) carries ``abort <id>`` / ``stop`` from the orchestrator;
a status bus (PUSH → PULL) carries JSON messages back to it: ``ready``, ``fatal`` (the stage could not
start: ``error`` = ``"<ExceptionType>: <message>"``), per-request ``error`` and ``stats``
(:mod:`.stage_stats`). Request ids are ints on the wire and strings inside the workers.

The loop blocks on its sockets (control bus, input edge) while the worker has nothing to do, so an
idle stage costs no CPU; while it has work it only peeks at them between steps.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import zmq

from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.messages import (
    StageMessage,
    goes_downstream,
    is_partial_transcript,
    meta_from_wire,
    meta_to_wire,
)
from omniduplex.pipeline.runtime import plugins
from omniduplex.pipeline.runtime.stage_stats import StatsReporter, producer_stats, worker_stats
from omniduplex.pipeline.stages.contract import StageWorker
from omniduplex.pipeline.stages.kinds import STAGE_KINDS
from omniduplex.pipeline.topology import ORCHESTRATOR, Topology
from omniduplex.relay import ConsumerDied, EdgeConfig, EdgeConsumer, EdgeProducer, RelayError

META_KEY = "__meta__"
IDLE_WAIT_S = 1.0
"""Longest an idle stage blocks on its sockets before it looks at its stats again (s)."""
STALLED_WAIT_S = 0.001
"""After a step that produced nothing (a Talker whose turns wait for Thinker text), wait this long for input
before the next step (s): input ends the wait at once, and the stage does not spin a core meanwhile."""


@dataclass
class Wiring:
    """Addresses of one pipeline run: ``run_dir`` holds the ipc sockets."""

    run_dir: str

    def edge(self, src: str, dst: str) -> str:
        return f"ipc://{self.run_dir}/{src}-{dst}.sock"

    @property
    def control(self) -> str:
        return f"ipc://{self.run_dir}/control.sock"

    @property
    def status(self) -> str:
        return f"ipc://{self.run_dir}/status.sock"


def edge_config(pcfg: PipelineConfig, src: str, dst: str) -> EdgeConfig:
    e = pcfg.edges.get(f"{src}->{dst}")
    return EdgeConfig(slots=e.slots, slot_bytes=e.slot_bytes) if e else EdgeConfig(slots=16)


class StageStartError(RuntimeError):
    """A stage process did not report ready: ``stage`` failed with ``cause`` (``"<ExceptionType>: <message>"``
    as the stage reported it, e.g. ``"CheckpointError: ..."``; ``None`` when it died without a word or timed
    out)."""

    def __init__(self, message: str, stage: str | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.stage, self.cause = stage, cause


def kill_leftovers(proc: mp.Process) -> None:
    """Kill what a stopped or dead stage process leaves behind: the processes of the process group it leads,
    if it made one (a vLLM stage does: vLLM's engine core and workers, which outlive a stage killed outright).
    A stage that made no group has none with its pid as id, so nothing else is touched."""
    if proc.pid is None or proc.pid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def pack(msg: StageMessage, edge: tuple[str, str], topo: Topology) -> dict[str, torch.Tensor]:
    """Tensors of ``msg`` that travel on ``edge`` (``topo.edge_tensors``), plus its typed meta as a tagged
    JSON byte tensor (:func:`~omniduplex.pipeline.messages.meta_to_wire`)."""
    keep = topo.edge_tensors[edge]
    out = {k: v.contiguous() for k, v in msg.tensors.items() if keep is None or k in keep}
    out[META_KEY] = torch.frombuffer(bytearray(meta_to_wire(msg.meta)), dtype=torch.uint8)
    return out


def unpack(request_id: int, tensors: dict[str, torch.Tensor], last: bool) -> StageMessage:
    """The message :func:`pack` sent: its meta read back as its kind, validated.

    Raises:
        EdgeMessageError: the meta is missing or does not fit its kind."""
    raw = tensors.pop(META_KEY, None)
    data = bytes(raw.numpy()) if raw is not None else b"{}"
    return StageMessage(str(request_id), tensors, meta_from_wire(data, str(request_id)), last)


def describe(e: BaseException) -> str:
    """``"<ExceptionType>: <message>"``: the one-line cause a stage reports."""
    return f"{type(e).__name__}: {e}"


class StageLoop:
    """One stage process's sockets and worker; :meth:`run` until the orchestrator says ``stop``.

    ``instance``: the stage, or one replica of it (``talker@1``, :mod:`.replicas`): it reads one input edge
    from each instance of its upstream stage and sends each request to the instance of each downstream stage
    the request is pinned to."""

    def __init__(self, instance: str, pcfg: PipelineConfig, wiring: Wiring, ctx: zmq.Context, status) -> None:
        from omniduplex.pipeline.runtime.replicas import ReplicaPlan, stage_of
        from omniduplex.pipeline.workers import build_worker

        stage = stage_of(instance)
        self.instance, self.plan = instance, ReplicaPlan(pcfg)
        self.replica = self.plan.instances(stage).index(instance)
        self.stage, self.status, self.topo = stage, status, pcfg.topology()
        self.kind = STAGE_KINDS[stage]
        scfg = pcfg.stage(stage)
        torch.set_num_threads(scfg.torch_threads)
        self.control = ctx.socket(zmq.SUB)
        self.control.connect(wiring.control)
        self.control.setsockopt(zmq.SUBSCRIBE, b"")
        self.producers: dict[str, EdgeProducer] = {}  # by downstream instance
        self.consumers: list[EdgeConsumer] = []  # one per upstream instance
        self.worker: StageWorker | None = None
        try:
            for dst in self.topo.out_edges(stage):
                for d in self.plan.instances(dst):
                    self.producers[d] = EdgeProducer(
                        f"{instance}-{d}", wiring.edge(instance, d), edge_config(pcfg, stage, dst)
                    )
            for src in self.plan.instances(self.topo.upstream(stage)):
                self.consumers.append(EdgeConsumer(f"{src}-{instance}", wiring.edge(src, instance)))
            self.worker = build_worker(stage, pcfg.model, scfg, pcfg.chunking, pcfg.side_asr)
        except BaseException:
            self.close()
            raise
        self.seqs: dict[tuple[str, str], int] = {}
        self.busy_s = 0.0  # seconds inside worker.step() since start (the stage's busy time)
        self.reporter = StatsReporter(self.snapshot, status.send_json)
        self.parent_pid = os.getppid()

    def run(self) -> None:
        """Block on the sockets while idle; step the worker and send its outputs while busy. Returns on
        ``stop`` from the orchestrator, or once idle if the server process is gone (SIGKILL, OOM kill)."""
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        inputs = [sock for c in self.consumers for sock in c.sockets]
        for sock in inputs:
            poller.register(sock, zmq.POLLIN)
        wait_s = 0.0
        while True:
            if not self.worker.has_work():
                if os.getppid() != self.parent_pid:  # the server was killed outright: no orphans
                    print(f"omniduplex stage {self.instance}: server process gone; exiting", file=sys.stderr)
                    self.close()  # unlinks this stage's slot pools
                    return
                wait_s = min(IDLE_WAIT_S, self.reporter.wait_s())
            ready = {sock for sock, _ in poller.poll(max(1, int(1000 * wait_s)) if wait_s else 0)}
            if self.control in ready and self._control():
                return
            if any(sock in ready for sock in inputs):
                self._receive()
            busy = self.worker.has_work()
            self.reporter.tick(busy)
            wait_s = 0.0
            if busy and not self._step():
                wait_s = STALLED_WAIT_S

    def snapshot(self) -> dict:
        """The ``stats`` message: worker gauges (with ``busy_s``: seconds spent in its ``step`` so far) and
        the credits of each output edge."""
        return {
            "kind": "stats",
            "stage": self.instance,
            "worker": {**worker_stats(self.worker), "busy_s": self.busy_s},
            "edges": {f"{self.instance}->{dst}": producer_stats(p) for dst, p in self.producers.items()},
        }

    def close(self) -> None:
        """Close the edges, and the worker when it holds resources of its own (vLLM's engine processes)."""
        for p in self.producers.values():
            p.close()
        for c in self.consumers:
            c.close()
        if self.worker is not None:  # None: the build failed
            self.worker.close()

    def _fail(self, rid: str, error: str) -> None:
        self.worker.abort(rid)
        self.status.send_json(
            {"kind": "error", "stage": self.instance, "request_id": int(rid), "error": error}
        )

    def _control(self) -> bool:
        """Handle the control bus; ``True`` on ``stop`` (the edges are closed)."""
        while self.control.poll(0):
            cmd = self.control.recv_string()
            if cmd == "stop":
                self.close()
                return True
            if cmd.startswith("abort "):
                rid = cmd.split()[1]
                if self.plan.replica_of(int(rid), self.stage) != self.replica:
                    continue  # pinned to another replica of this stage
                self.worker.abort(rid)
                for c in self.consumers:
                    c.abort(int(rid))
                for p in self.producers.values():
                    p.abort(int(rid))
        return False

    def _receive(self) -> None:
        """Submit every complete message waiting on the input edges."""
        for consumer in self.consumers:
            try:
                m = consumer.recv(timeout_s=0)
                while m is not None:
                    try:
                        self.worker.submit(unpack(m.request_id, m.tensors, m.last))
                    except Exception as e:  # bad input for this request only
                        self._fail(str(m.request_id), f"{self.stage}: {e}")
                    m = consumer.recv(timeout_s=0)
            except RelayError:
                # upstream stage stopped or died: its turns are failed by the orchestrator, which restarts
                # it; our consumer re-attaches when the new producer binds (a monitor event wakes us).
                pass

    def _step(self) -> bool:
        """One worker step; its outputs go downstream. ``False`` when it produced nothing."""
        t0 = time.perf_counter()
        outs = self.worker.step()
        self.busy_s += time.perf_counter() - t0
        for rid, error in self.worker.pop_errors():
            self._fail(rid, f"{self.stage}: {error}")
        for msg in outs:
            if (error := self.kind.check_output(msg)) is not None:  # the wrong kind fails its turn only
                self._fail(msg.request_id, error)
                continue
            for dst in self.topo.out_edges(self.stage):
                producer = self.producers[self.plan.instance_for(int(msg.request_id), dst)]
                partial = is_partial_transcript(msg)
                if dst != ORCHESTRATOR and not goes_downstream(msg):
                    continue  # a partial transcript without prefill context is for captions only
                tensors = pack(msg, (self.stage, dst), self.topo)
                if not (set(tensors) - {META_KEY}) and not msg.last and not partial:
                    continue  # nothing for this edge in this message
                key = (msg.request_id, dst)
                seq = self.seqs.get(key, 0)
                self.seqs[key] = seq + 1
                try:
                    try:
                        producer.send(int(msg.request_id), tensors, seq=seq, last=msg.last)
                    except ConsumerDied:
                        # reported once, at the first send after the consumer died (its turns were failed
                        # by the orchestrator): this chunk was not sent; send it to the restarted consumer
                        producer.send(int(msg.request_id), tensors, seq=seq, last=msg.last)
                except RelayError as e:
                    self._fail(msg.request_id, f"{self.stage}->{dst}: {e}")
                if msg.last:
                    self.seqs.pop(key, None)
        return bool(outs)


class StageStartFailed(Exception):
    """This stage could not start; the cause went to the orchestrator as a ``fatal`` status message."""


def stage_main(stage: str, pcfg_json: str, run_dir: str, plugin_names: Sequence[str] = ()) -> None:
    """Entry point of a stage process (``multiprocessing`` spawn target); ``stage``: the stage or one replica
    of it (``talker@1``); ``plugin_names``: the parent's plugins, imported first (:func:`.plugins.load`).

    Raises:
        StageStartFailed: start-up failed (from the exception that made it, reported on the status bus).
    """
    wiring = Wiring(run_dir)
    ctx = zmq.Context.instance()
    status = ctx.socket(zmq.PUSH)
    status.connect(wiring.status)
    try:
        plugins.load(plugin_names)
        loop = StageLoop(stage, PipelineConfig.model_validate_json(pcfg_json), wiring, ctx, status)
    except Exception as e:
        status.send_json({"kind": "fatal", "stage": stage, "error": describe(e)})
        ctx.destroy(linger=2000)  # deliver the report before the process exits
        raise StageStartFailed(describe(e)) from e
    status.send_json({"kind": "ready", "stage": stage, "pid": os.getpid()})
    loop.run()


def run_stage(stage: str, pcfg_json: str, run_dir: str, plugin_names: Sequence[str] = ()) -> None:
    """``stage_main`` after importing the parent's plugins (:func:`.plugins.loaded`: the families they
    register), exiting with code 1 on failure: one line on stderr for a start-up failure that is one of our
    own errors (its message says what to fix), the traceback for anything else."""
    try:
        stage_main(stage, pcfg_json, run_dir, plugin_names)
    except StageStartFailed as e:
        cause = e.__cause__
        if not type(cause).__module__.startswith("omniduplex."):
            traceback.print_exception(cause)
        print(f"omniduplex stage {stage}: failed to start: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception:
        traceback.print_exc()
        raise
