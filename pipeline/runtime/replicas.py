"""Stage replicas: ``replicas: N`` on a stage runs N processes of it, and each request is pinned to one.

A replicated stage's processes are its *instances*, named ``<stage>@<i>`` (i = 0 .. N-1); a stage with one
replica keeps its plain name, so ``replicas: 1`` (the default) wires exactly as before. Every instance has
its own edges: one from each instance of its upstream stage (or the orchestrator) and one to each instance
of each downstream stage.

The pin rides in the relay request id itself, so every sender and receiver finds a request's replica
without a lookup table or an extra message: the orchestrator picks the replica of every replicated stage
when a request starts (the one with the fewest live requests, :meth:`ReplicaPlan.choose`) and builds the id
from the choices in mixed radix, ``rid = n * modulus + sum(choice[s] * stride[s])``;
:meth:`ReplicaPlan.replica_of` reads a stage's choice back. Every message of the request, its aborts
included, goes to that instance for the request's lifetime (its KV cache and stream state live there).
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping

from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.topology import ORCHESTRATOR

SEP = "@"
"""Between a stage's name and its replica index in an instance name (``talker@1``)."""


def stage_of(instance: str) -> str:
    """The stage an instance runs (``"talker@1"`` → ``"talker"``; a plain stage name is its own)."""
    return instance.partition(SEP)[0]


class ReplicaPlan:
    """The instances of each stage of ``pcfg``'s graph and the request-id encoding of the pins."""

    def __init__(self, pcfg: PipelineConfig) -> None:
        topo = pcfg.topology()
        self.counts = {s: pcfg.stage(s).replicas for s in topo.all_stages}
        self.counts[ORCHESTRATOR] = 1
        self.replicated = tuple(s for s in topo.all_stages if self.counts[s] > 1)
        self.strides: dict[str, int] = {}
        stride = 1
        for s in self.replicated:
            self.strides[s] = stride
            stride *= self.counts[s]
        self.modulus = math.prod(self.counts[s] for s in self.replicated)

    def instances(self, stage: str) -> list[str]:
        """Instance names of ``stage`` (``[stage]`` when it has one replica)."""
        n = self.counts[stage]
        return [stage] if n == 1 else [f"{stage}{SEP}{i}" for i in range(n)]

    def all_instances(self) -> list[str]:
        """Every stage process of the graph, in stage order."""
        return [i for s in self.counts if s != ORCHESTRATOR for i in self.instances(s)]

    def replica_of(self, rid: int, stage: str) -> int:
        """The replica index request ``rid`` is pinned to on ``stage`` (0 when it has one)."""
        if self.counts.get(stage, 1) == 1:
            return 0
        return (rid % self.modulus) // self.strides[stage] % self.counts[stage]

    def instance_for(self, rid: int, stage: str) -> str:
        """The instance of ``stage`` that holds request ``rid``."""
        return self.instances(stage)[self.replica_of(rid, stage)]

    def choose(self, live: Mapping[str, int], up: Container[str] | None = None) -> dict[str, int]:
        """For each replicated stage, the replica with the fewest live requests (``live``: instance →
        count; ties go to the lowest index), among those in ``up`` (the ones running; all of a stage's
        replicas when none of them is)."""
        out = {}
        for s in self.replicated:
            names = self.instances(s)
            ready = [i for i in range(len(names)) if up is None or names[i] in up] or range(len(names))
            out[s] = min(ready, key=lambda i, names=names: (live.get(names[i], 0), i))
        return out

    def rid(self, n: int, choice: Mapping[str, int]) -> int:
        """The relay request id of the ``n``-th request (n ≥ 1) pinned to ``choice`` (stage → replica)."""
        return n * self.modulus + sum(choice[s] * self.strides[s] for s in self.replicated)
