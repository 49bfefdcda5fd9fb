"""The stage processes of a :class:`~.process_backend.ProcessBackend`: spawn, wait for ready, read the status
bus, notice a death and restart.

:class:`StageProcesses` owns the processes and their status (``procs``, ``up``, ``late``, ``restarts``, the
last ``stats`` report of each); the backend that inherits it owns the requests and answers
:meth:`StageProcesses._stage_died` (fail the turns the dead stage held) and :meth:`StageProcesses._fail`
(one request failed by a stage).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import threading
import time

import zmq

from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.runtime import plugins
from omniduplex.pipeline.runtime.replicas import ReplicaPlan, stage_of
from omniduplex.pipeline.runtime.stage_process import StageStartError, kill_leftovers, run_stage

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 180.0
"""Default time a stage process has to report ready (s); ``ProcessBackend(start_timeout_s=...)``."""


class StageProcesses:
    """Spawn and watch one OS process per stage instance (the stage, or each of its replicas:
    :mod:`.replicas`; ``procs``, ``up``, ``restarts`` and the stats are keyed by instance); the status bus
    (``self.status``, a ZMQ PULL socket) is bound by the subclass before :meth:`_spawn`."""

    status: zmq.Socket
    _poller: zmq.Poller | None

    def __init__(
        self, pcfg: PipelineConfig, restart_on_crash: bool, start_timeout_s: float, wait_when_late: bool
    ) -> None:
        self.pcfg, self.restart_on_crash = pcfg, restart_on_crash
        self.start_timeout_s, self.wait_when_late = start_timeout_s, wait_when_late
        self.topo = pcfg.topology()
        self.plan = ReplicaPlan(pcfg)
        self.instances = self.plan.all_instances()  # one process each: the stages, or their replicas
        self.mp = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        self.restarts = {s: 0 for s in self.instances}
        self.stage_stats: dict[str, dict] = {}  # last ``stats`` message of each stage
        self.up: set[str] = set()  # stages that reported ready and have not died since
        self.late: set[str] = set()  # stages past start_timeout_s at the first start, still awaited
        self.abandoned = threading.Event()  # :meth:`abandon_start` was called
        self.restarting: dict[str, float] = {}  # replicas restarted, not ready yet → deadline (monotonic s)
        self._poller = None

    def _stage_died(self, stage: str, exitcode: int | None) -> None:
        """Fail the turns ``stage`` held (the subclass)."""
        raise NotImplementedError

    def _fail(self, rid: int, error: str, stage: str | None = None) -> None:
        """Fail request ``rid`` with ``error`` (the subclass)."""
        raise NotImplementedError

    def kill_stage(self, stage: str) -> None:
        """Kill a stage process, ``stage`` being an instance name (``talker``, or ``talker@1`` for a replica):
        fault injection for tests and chaos runs."""
        self.procs[stage].kill()

    # -- process management ------------------------------------------------------------------------
    def _spawn(self, stage: str) -> None:
        p = self.mp.Process(
            target=run_stage,
            args=(stage, self.pcfg.model_dump_json(), self.run_dir, plugins.loaded()),
            name=f"omniduplex-{stage}",
            daemon=True,
        )
        p.start()
        old = self.procs.get(stage)
        self.procs[stage] = p
        if self._poller is not None:
            if old is not None:
                self._poller.unregister(old.sentinel)
            self._poller.register(p.sentinel, zmq.POLLIN)
        if old is not None:  # dead: reap it and close its sentinel, or every restart leaks a descriptor
            old.join(timeout=5)
            with contextlib.suppress(ValueError):
                old.close()

    def _wait_ready(self, stages: set[str], give_up: bool = True) -> None:
        """Wait for ``stages`` to report ready, up to ``start_timeout_s`` (past it, with ``give_up`` off: as
        long as they live, marked :attr:`late`).

        Raises:
            StageStartError: a stage reported a fatal error, died, or (``give_up``) did not report in time;
                :meth:`abandon_start` was called.
        """
        deadline = time.monotonic() + self.start_timeout_s
        while stages:
            if self.abandoned.is_set():
                raise StageStartError(f"start abandoned (the server is stopping): {sorted(stages)} not up")
            while self.status.poll(100 if stages else 0):
                self._on_status(self.status.recv_json())
                stages -= self.up
            for s in sorted(stages):
                if not self.procs[s].is_alive():
                    while self.status.poll(200):  # its fatal report may still be on the way
                        self._on_status(self.status.recv_json())
                    raise StageStartError(
                        f"stage {s} exited with code {self.procs[s].exitcode} during start-up", s
                    )
            if stages and time.monotonic() > deadline and not self.late >= stages:
                limit = f"not ready after {self.start_timeout_s:g} s (the start limit: --start-timeout)"
                if give_up:
                    raise StageStartError(f"stages {sorted(stages)} {limit}")
                log.warning("stages %s %s: still waiting for them", sorted(stages), limit)
                self.late |= stages

    def _on_status(self, m: dict) -> None:
        """One status-bus message (see :mod:`.stage_process`)."""
        kind = m.get("kind")
        if kind == "stats":
            self.stage_stats[m["stage"]] = m
        elif kind == "ready":
            self.up.add(m["stage"])
        elif kind == "error":
            self._fail(m["request_id"], m["error"], m.get("stage"))
        elif kind == "fatal" and (s := m["stage"]) in self.restarting:
            log.error("restart %d of %s failed: %s; trying again", self.restarts[s], s, m["error"])
            self.procs[s].kill()  # the next check sees it dead and spawns it again
            del self.restarting[s]
        elif kind == "fatal":
            raise StageStartError(f"stage {m['stage']} failed to start: {m['error']}", m["stage"], m["error"])

    def _check_stages(self) -> None:
        """Restart each dead stage process. A stage with one replica is waited for here (the turns sent
        meanwhile queue); a replica is not (:attr:`restarting`): the backend thread goes on serving the
        other replicas' requests, and a replica past ``start_timeout_s`` is killed and tried again."""
        for s, p in self.procs.items():
            if p.is_alive():
                if s in self.restarting and s in self.up:
                    del self.restarting[s]
                elif s in self.restarting and time.monotonic() > self.restarting[s]:
                    log.error("restart %d of %s: not ready in %g s; trying again", self.restarts[s], s,
                              self.start_timeout_s)
                    p.kill()
                    del self.restarting[s]
                continue
            kill_leftovers(p)
            self._stage_died(s, p.exitcode)
            self.up.discard(s)
            self.stage_stats.pop(s, None)
            if not self.restart_on_crash:
                raise RuntimeError(f"stage {s} died")
            self.restarts[s] += 1
            self._spawn(s)
            if self.plan.counts[stage_of(s)] > 1:
                self.restarting[s] = time.monotonic() + self.start_timeout_s
                continue
            try:
                self._wait_ready({s})
            except StageStartError as e:
                # the restart failed (a fatal report, or not ready in time): end that process, so the next
                # check sees it dead and tries again; the backend thread and the other stages keep running
                log.error("restart %d of stage %s failed: %s; trying again", self.restarts[s], s, e)
                self.procs[s].kill()
