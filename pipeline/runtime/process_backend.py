"""Each stage in its own process, joined by the relay; the orchestrator's side of the wiring.

A backend thread owns every socket of the orchestrator process (ZMQ sockets are not thread-safe):
it sends new turns to the first stage's edge, reads the stage → orchestrator edges of the checkpoint's
graph (:mod:`.topology`), the status bus (ready, per-request errors) and watches the stage processes.
A stage that dies fails the turns in flight (error events), its peers drop those turns (abort on the
control bus), and it is restarted; its edges re-attach (the relay's reattach) and the next turns run
normally. A stage that fails to start names its cause (:class:`StageStartError`).

The thread blocks on its sockets (status bus, input edges, the stage processes' sentinels and a wake-up
pipe written by :meth:`ProcessBackend.send` / :meth:`ProcessBackend.abort`), so an idle pipeline costs no
CPU and a new turn wakes it at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import shutil
import tempfile
import threading
import time

import zmq

from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.messages import StageError, StageMessage
from omniduplex.pipeline.orchestrator import OutputCallback
from omniduplex.pipeline.runtime.replicas import stage_of
from omniduplex.pipeline.runtime.stage_process import (
    StageStartError,
    Wiring,
    edge_config,
    kill_leftovers,
    pack,
    unpack,
)
from omniduplex.pipeline.runtime.stage_processes import STARTUP_TIMEOUT_S, StageProcesses
from omniduplex.pipeline.runtime.stage_stats import producer_stats
from omniduplex.pipeline.topology import ORCHESTRATOR
from omniduplex.pipeline.workers import prepare
from omniduplex.relay import ConsumerDied, EdgeConsumer, EdgeProducer, RelayError, sweep_orphans

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
"""Longest the backend thread blocks before it looks at the stage processes anyway (s); a stage's death
wakes it at once (its process sentinel)."""


class ProcessBackend(StageProcesses):
    """Stage processes + relay edges. ``restart_on_crash`` restarts a dead stage (default on).

    ``start_timeout_s``: how long a stage process has to report ready. A stage restarted after a crash that
    misses it is killed and tried again. At the first start, a stage that misses it fails :meth:`start`
    (``StageStartError``), unless ``wait_when_late``: then it is reported late (one log line; ``stats()``
    ``late``) and waited for, since a loaded machine's first start can be slow (one-time model imports and
    kernel builds), while a server answers "not ready" meanwhile.
    """

    def __init__(
        self,
        pcfg: PipelineConfig,
        restart_on_crash: bool = True,
        start_timeout_s: float = STARTUP_TIMEOUT_S,
        wait_when_late: bool = False,
    ) -> None:
        super().__init__(pcfg, restart_on_crash, start_timeout_s, wait_when_late)
        self.run_dir = tempfile.mkdtemp(prefix="omniduplex-")
        self.wiring = Wiring(self.run_dir)
        self.commands: queue.Queue = queue.Queue()
        self.ids: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.inflight: set[int] = set()
        self.pins: dict[int, list[str]] = {}  # replicas each request is pinned to (replicated stages only)
        self.live = {i: 0 for s in self.plan.replicated for i in self.plan.instances(s)}
        self.assigned = dict(self.live)
        self.entry_seqs: dict[int, int] = {}  # next chunk seq of turns sent in pieces (backend thread)
        self._counter = itertools.count(1)
        self.waiting: dict[int, set[str]] = {}  # terminal stages whose ``last`` each turn still awaits
        self.entry_stats: dict[str, dict] = {}  # credits of the orchestrator's own edges (backend thread)
        self.thread: threading.Thread | None = None
        self.running = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # -- Backend interface (any thread) ------------------------------------------------------------
    def start(self, on_output: OutputCallback) -> None:
        self.on_output = on_output
        try:
            if self.abandoned.is_set():
                raise StageStartError("start abandoned (the server is stopping)")
            prepare(self.pcfg)  # e.g. a GGUF import, or no vLLM for a `backend: vllm` stage
        except BaseException:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        ctx = zmq.Context.instance()
        self.status = ctx.socket(zmq.PULL)
        self.status.bind(self.wiring.status)
        self.control = ctx.socket(zmq.PUB)
        self.control.bind(self.wiring.control)
        self.to_entry = {
            s: EdgeProducer(
                f"{ORCHESTRATOR}-{s}",
                self.wiring.edge(ORCHESTRATOR, s),
                edge_config(self.pcfg, ORCHESTRATOR, stage),
            )
            for stage in self.topo.entry_stages
            for s in self.plan.instances(stage)
        }
        self.inputs = {
            s: EdgeConsumer(f"{s}-{ORCHESTRATOR}", self.wiring.edge(s, ORCHESTRATOR))
            for stage in self.topo.all_stages
            if stage in self.topo.to_orchestrator
            for s in self.plan.instances(stage)
        }
        for s in self.instances:
            self._spawn(s)
        try:
            self._wait_ready(set(self.instances), give_up=not self.wait_when_late)
        except BaseException:  # a stage failed to start: the others are killed, nothing is left behind
            for p in self.procs.values():
                p.kill()
                p.join(timeout=5)
                kill_leftovers(p)
            self._release()
            raise
        self.running = True
        self.thread = threading.Thread(target=self._loop, name="omniduplex-process-backend", daemon=True)
        self.thread.start()

    def abandon_start(self) -> None:
        """The server is stopping before its stages are up (any thread): a :meth:`start` still waiting for
        them raises ``StageStartError`` within 0.1 s, having killed the stage processes it spawned."""
        self.abandoned.set()

    def send(self, msg: StageMessage) -> None:
        self.commands.put(("send", msg))
        self._wake()

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))
        self._wake()

    @property
    def ready(self) -> bool:
        """Every stage (every replica) is up (started, and not dead or restarting)."""
        return self.running and self.up >= set(self.instances)

    def stats(self) -> dict:
        """Pipeline gauges: ``stages`` (stage → :func:`.stage_stats.worker_stats`, as last reported, about
        once a second while busy), ``edges`` (``"src->dst"`` → :func:`.stage_stats.producer_stats`),
        ``restarts`` (stage → count), ``up`` (stage → bool), ``late`` (stage → past ``start_timeout_s`` at
        the first start and not up yet) and ``start_timeout_s``; a replicated stage is reported per
        replica (``talker@0``, ``talker@1``, :mod:`.replicas`), and ``replicas`` gives each replica's
        ``live`` (requests pinned to it now) and ``assigned`` (requests pinned to it since start)."""
        reports = list(self.stage_stats.values())
        edges = {e: dict(v) for r in reports for e, v in r.get("edges", {}).items()}
        edges.update(self.entry_stats)
        return {
            "stages": {r["stage"]: dict(r.get("worker", {})) for r in reports},
            "edges": edges,
            "restarts": dict(self.restarts),
            "up": {s: s in self.up for s in self.instances},
            "late": {s: s in self.late and s not in self.up for s in self.instances},
            "start_timeout_s": self.start_timeout_s,
            "replicas": {
                i: {"live": self.live[i], "assigned": self.assigned[i]}
                for s in self.plan.replicated
                for i in self.plan.instances(s)
            },
        }

    def stop(self) -> None:
        self.running = False
        self._wake()
        if self.thread:
            self.thread.join(timeout=10)
        with contextlib.suppress(zmq.ZMQError):
            self.control.send_string("stop")
        for p in self.procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
            kill_leftovers(p)
        self._release()

    def _release(self) -> None:
        """Reap the stage processes, sweep the slot pools of any that died, close sockets and pipe, remove the
        run directory."""
        for p in self.procs.values():
            p.join(timeout=5)
        sweep_orphans()
        for p in self.to_entry.values():
            p.close()
        for c in self.inputs.values():
            c.close()
        self.status.close(linger=0)
        self.control.close(linger=0)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _stage_died(self, instance: str, exitcode: int | None) -> None:
        """Fail the turns ``instance`` held: all in flight for a stage with one replica, else the ones
        pinned to that replica (the others keep running on theirs)."""
        stage = stage_of(instance)
        if self.plan.counts[stage] == 1:
            for rid in sorted(self.inflight):
                self._fail(rid, f"stage {stage} died (exit code {exitcode}); the turn was lost", stage)
            return
        replica = self.plan.instances(stage).index(instance)
        for rid in sorted(r for r in self.inflight if instance in self.pins.get(r, ())):
            error = f"stage {stage} replica {replica} died (exit code {exitcode}); the turn was lost"
            self._fail(rid, error, instance)

    # -- backend thread ------------------------------------------------------------------------------
    def _fail(self, rid: int, error: str, stage: str | None = None) -> None:
        if rid not in self.inflight:
            return
        name = self.names.get(rid, str(rid))
        self._forget(rid)
        self.control.send_string(f"abort {rid}")
        self.on_output(StageMessage(name, {}, StageError(error=error, stage=stage), last=True))

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # pipe full: a wake-up is pending anyway; closed: stopped
            os.write(self._wake_w, b"!")

    def _loop(self) -> None:
        self._poller = poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self.status, zmq.POLLIN)
        owner: dict[zmq.Socket, str] = {}
        for s, consumer in self.inputs.items():
            for sock in consumer.sockets:
                poller.register(sock, zmq.POLLIN)
                owner[sock] = s
        for p in self.procs.values():
            poller.register(p.sentinel, zmq.POLLIN)
        last_check = 0.0  # check (and read the entry edges' credits) at once
        while self.running:
            wait_s = max(0.0, last_check + CHECK_EVERY_S - time.monotonic())
            ready = {x for x, _ in poller.poll(max(1, int(wait_s * 1000)))}
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            self._run_commands()
            if self.status in ready:
                while self.status.poll(0):
                    self._on_status(self.status.recv_json())
            for s in {owner[x] for x in ready if x in owner}:
                self._receive(s)
            died = any(isinstance(x, int) and x != self._wake_r for x in ready)  # a process sentinel
            now = time.monotonic()
            if died or now - last_check >= CHECK_EVERY_S:
                last_check = now
                self._check_stages()
                self.entry_stats = {
                    f"{ORCHESTRATOR}->{s}": producer_stats(p) for s, p in self.to_entry.items()
                }

    def _run_commands(self) -> None:
        while not self.commands.empty():
            kind, item = self.commands.get_nowait()
            if kind == "send":
                self._send_turn(item)
                continue
            rid = self.ids.get(item)
            if rid is not None:
                self._forget(rid)
                self.control.send_string(f"abort {rid}")

    def _send_turn(self, item: StageMessage) -> None:
        """Send a turn (``last``) or a piece of one still being spoken (``last=False``: the pieces and the
        turn share one relay request id, chunk ``seq`` 0, 1, ...)."""
        rid = self.ids.get(item.request_id)
        if rid is None:
            rid = self.plan.rid(next(self._counter), self.plan.choose(self.live, self.up))
            self.pins[rid] = [self.plan.instance_for(rid, s) for s in self.plan.replicated]
            for i in self.pins[rid]:
                self.live[i] += 1
                self.assigned[i] += 1
            self.ids[item.request_id], self.names[rid] = rid, item.request_id
            self.inflight.add(rid)
            self.waiting[rid] = set(self.topo.terminal_stages)
        seq = self.entry_seqs.pop(rid, 0)
        if not item.last:
            self.entry_seqs[rid] = seq + 1
        for s in self.topo.entry_stages:
            producer = self.to_entry[self.plan.instance_for(rid, s)]
            payload = pack(item, (ORCHESTRATOR, s), self.topo)
            try:
                try:
                    producer.send(rid, payload, seq=seq, last=item.last)
                except ConsumerDied:  # the stage was restarted since the last turn: resend
                    producer.send(rid, payload, seq=seq, last=item.last)
            except Exception as e:  # a relay error, or a turn the relay cannot carry
                self._fail(rid, f"{ORCHESTRATOR}->{s}: {type(e).__name__}: {e}")
                break

    def _receive(self, instance: str) -> None:
        """Deliver every complete message waiting on ``instance``'s edge to the orchestrator."""
        consumer = self.inputs[instance]
        try:
            m = consumer.recv(timeout_s=0)
            while m is not None:
                self._deliver(stage_of(instance), m)
                m = consumer.recv(timeout_s=0)
        except RelayError:
            pass  # the stage died; _check_stages handles it

    def _deliver(self, stage: str, m) -> None:
        name = self.names.get(m.request_id)
        if name is None:
            return  # finished, failed or aborted
        try:
            msg = unpack(m.request_id, m.tensors, m.last)
        except ValueError as e:  # a message that does not fit its kind fails its turn, naming the stage
            self._fail(m.request_id, f"{stage}: {e}", stage)
            return
        msg.request_id = name
        waiting = self.waiting.get(m.request_id)
        if m.last and waiting is not None and stage in waiting:
            waiting.discard(stage)
            if not waiting:  # released before the orchestrator sees the end (as in _fail): a caller that
                self._forget(m.request_id)  # reads stats() on "done" finds the request no longer live
        self.on_output(msg)

    def _forget(self, rid: int) -> None:
        self.inflight.discard(rid)
        for i in self.pins.pop(rid, ()):
            self.live[i] -= 1
        self.entry_seqs.pop(rid, None)
        self.waiting.pop(rid, None)
        name = self.names.pop(rid, None)
        if name is not None:
            self.ids.pop(name, None)
