"""Each stage in its own process, joined by the relay; the orchestrator's side of the wiring.

A backend thread owns every socket of the orchestrator process (ZMQ sockets are not thread-safe):
it sends new turns to the first stage's edge, reads the stage → orchestrator edges of the checkpoint's
graph (:mod:`.topology`), the status bus (ready, per-request errors) and watches the stage processes.
A stage that dies fails the turns in flight (error events), its peers drop those turns (abort on the
control bus), and it is restarted; its edges re-attach (the relay's reattach) and the next turns run
normally.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import queue
import shutil
import tempfile
import threading
import time

import zmq

from omniduplex.relay import ConsumerDied, EdgeConsumer, EdgeProducer, RelayError

from .config import PipelineConfig
from .graph import prepare
from .messages import StageMessage
from .orchestrator import OutputCallback, output_sources
from .stage_process import POLL_BUSY_S, Wiring, edge_config, pack, run_stage, unpack
from .topology import ORCHESTRATOR

STARTUP_TIMEOUT_S = 180.0


class StageStartError(RuntimeError):
    """A stage process did not report ready in time (bad model path, import error, ...)."""


class ProcessBackend:
    """Stage processes + relay edges. ``restart_on_crash`` restarts a dead stage (default on)."""

    def __init__(self, pcfg: PipelineConfig, restart_on_crash: bool = True) -> None:
        self.pcfg, self.restart_on_crash = pcfg, restart_on_crash
        self.topo = pcfg.topology()
        self.run_dir = tempfile.mkdtemp(prefix="omniduplex-")
        self.wiring = Wiring(self.run_dir)
        self.mp = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        self.commands: queue.Queue = queue.Queue()
        self.ids: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.inflight: set[int] = set()
        self._counter = itertools.count(1)
        self.restarts = {s: 0 for s in self.topo.all_stages}
        self.waiting: dict[int, set[str]] = {}  # terminal stages whose ``last`` each turn still awaits
        self.thread: threading.Thread | None = None
        self.running = False

    # -- Backend interface (any thread) ------------------------------------------------------------
    def start(self, on_output: OutputCallback) -> None:
        self.on_output = on_output
        prepare(self.pcfg)
        ctx = zmq.Context.instance()
        self.status = ctx.socket(zmq.PULL)
        self.status.bind(self.wiring.status)
        self.control = ctx.socket(zmq.PUB)
        self.control.bind(self.wiring.control)
        self.to_entry = {
            s: EdgeProducer(
                f"{ORCHESTRATOR}-{s}",
                self.wiring.edge(ORCHESTRATOR, s),
                edge_config(self.pcfg, ORCHESTRATOR, s),
            )
            for s in self.topo.entry_stages
        }
        self.inputs = {
            s: EdgeConsumer(f"{s}-{ORCHESTRATOR}", self.wiring.edge(s, ORCHESTRATOR))
            for s in self.topo.all_stages
            if s in self.topo.to_orchestrator
        }
        for s in self.topo.all_stages:
            self._spawn(s)
        self._wait_ready(set(self.topo.all_stages))
        self.running = True
        self.thread = threading.Thread(target=self._loop, name="omniduplex-process-backend", daemon=True)
        self.thread.start()

    def send(self, msg: StageMessage) -> None:
        self.commands.put(("send", msg))

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def stop(self) -> None:
        self.running = False
        if self.thread:
            self.thread.join(timeout=10)
        with contextlib.suppress(zmq.ZMQError):
            self.control.send_string("stop")
        for p in self.procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for p in self.to_entry.values():
            p.close()
        for c in self.inputs.values():
            c.close()
        self.status.close(linger=0)
        self.control.close(linger=0)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def kill_stage(self, stage: str) -> None:
        """Kill a stage process (fault injection for tests and chaos runs)."""
        self.procs[stage].kill()

    # -- process management ------------------------------------------------------------------------
    def _spawn(self, stage: str) -> None:
        p = self.mp.Process(
            target=run_stage,
            args=(stage, self.pcfg.model_dump_json(), self.run_dir),
            name=f"omniduplex-{stage}",
            daemon=True,
        )
        p.start()
        self.procs[stage] = p

    def _wait_ready(self, stages: set[str]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while stages:
            for s in list(stages):
                if not self.procs[s].is_alive():
                    raise StageStartError(
                        f"stage {s} exited with code {self.procs[s].exitcode} during start-up"
                    )
            if time.monotonic() > deadline:
                raise StageStartError(f"stages {sorted(stages)} not ready after {STARTUP_TIMEOUT_S:.0f} s")
            if self.status.poll(100):
                m = self.status.recv_json()
                if m.get("kind") == "ready":
                    stages.discard(m["stage"])
                elif m.get("kind") == "error":
                    self._fail(m["request_id"], m["error"])

    def _check_stages(self) -> None:
        for s, p in self.procs.items():
            if p.is_alive():
                continue
            for rid in sorted(self.inflight):
                self._fail(rid, f"stage {s} died (exit code {p.exitcode}); the turn was lost")
            if not self.restart_on_crash:
                raise RuntimeError(f"stage {s} died")
            self.restarts[s] += 1
            self._spawn(s)
            self._wait_ready({s})

    # -- backend thread ------------------------------------------------------------------------------
    def _fail(self, rid: int, error: str) -> None:
        if rid not in self.inflight:
            return
        name = self.names.get(rid, str(rid))
        self._forget(rid)
        self.control.send_string(f"abort {rid}")
        self.on_output("error", StageMessage(name, meta={"error": error}, last=True))

    def _loop(self) -> None:
        last_check = 0.0
        while self.running:
            while not self.commands.empty():
                kind, item = self.commands.get_nowait()
                if kind == "send":
                    rid = next(self._counter)
                    self.ids[item.request_id], self.names[rid] = rid, item.request_id
                    self.inflight.add(rid)
                    self.waiting[rid] = set(self.topo.terminal_stages)
                    for s, producer in self.to_entry.items():
                        payload = pack(item, (ORCHESTRATOR, s), self.topo)
                        try:
                            try:
                                producer.send(rid, payload, last=True)
                            except ConsumerDied:  # the stage was restarted since the last turn: resend
                                producer.send(rid, payload, last=True)
                        except Exception as e:  # a relay error, or a turn the relay cannot carry
                            self._fail(rid, f"{ORCHESTRATOR}->{s}: {type(e).__name__}: {e}")
                            break
                else:
                    rid = self.ids.get(item)
                    if rid is not None:
                        self._forget(rid)
                        self.control.send_string(f"abort {rid}")
            while self.status.poll(0):
                m = self.status.recv_json()
                if m.get("kind") == "error":
                    self._fail(m["request_id"], m["error"])
            for s, consumer in self.inputs.items():
                try:
                    m = consumer.recv(timeout_s=POLL_BUSY_S)
                except RelayError:
                    continue  # the stage died; _check_stages handles it
                while m is not None:
                    self._deliver(s, m)
                    try:
                        m = consumer.recv(timeout_s=0)
                    except RelayError:
                        m = None
            now = time.monotonic()
            if now - last_check > 0.1:
                last_check = now
                self._check_stages()

    def _deliver(self, stage: str, m) -> None:
        name = self.names.get(m.request_id)
        if name is None:
            return  # finished, failed or aborted
        msg = unpack(m.request_id, m.tensors, m.last)
        msg.request_id = name
        for source in output_sources(stage, msg, self.topo):
            self.on_output(source, msg)
        waiting = self.waiting.get(m.request_id)
        if m.last and waiting is not None and stage in waiting:
            waiting.discard(stage)
            if not waiting:
                self._forget(m.request_id)

    def _forget(self, rid: int) -> None:
        self.inflight.discard(rid)
        self.waiting.pop(rid, None)
        name = self.names.pop(rid, None)
        if name is not None:
            self.ids.pop(name, None)
