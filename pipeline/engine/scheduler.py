"""Iteration-level scheduler (Orca, Yu et al. 2022; vLLM): which requests run this step, with how many tokens.

Every step: running requests first, oldest first, each taking its pending tokens (1 for a decode,
a chunk for a prefill) from the step's token budget; when KV blocks run out the youngest running
request is preempted (its blocks freed, recomputed later). Then waiting requests are admitted in
arrival order while budget, sequence slots and free blocks allow. Requests with nothing pending
(a Talker waiting for Thinker text) are skipped without losing their place.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockAllocator, blocks_for
from .request import Request, Status


@dataclass
class ScheduledBatch:
    """The step's plan: ``(request, num_tokens)`` in batch order, and the requests preempted for it."""

    items: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    """Owns the waiting/running queues and the block allocator.

    Args:
        allocator: the KV block pool.
        max_num_seqs: most requests running at once.
        max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
    """

    def __init__(
        self, allocator: BlockAllocator, max_num_seqs: int = 64, max_num_batched_tokens: int = 512
    ) -> None:
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}

    def add(self, req: Request) -> None:
        """Queue a request. Raises ValueError for a duplicate id or one that can never fit the cache."""
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        need = blocks_for(req.num_prompt + req.sampling.max_tokens)
        if need > self.allocator.num_blocks:
            raise ValueError(
                f"request {req.request_id!r} needs {need} KV blocks; the cache has "
                f"{self.allocator.num_blocks}"
            )
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def finish(self, req: Request, status: Status) -> None:
        """Mark finished (stop, length or abort) and release its blocks immediately."""
        if req.status.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.allocator.free(req.blocks)
        req.blocks = []
        req.status = status
        self.requests.pop(req.request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        out = ScheduledBatch()
        budget = self.max_num_batched_tokens
        # oldest first, so the preemption victim (the youngest) is never one already planned this step
        self.running.sort(key=lambda r: r.arrival)
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not Status.RUNNING or req.num_pending == 0:
                continue
            n = min(req.num_pending, budget)
            while not self._grow(req, req.num_computed + n):
                victim = max(self.running, key=lambda r: r.arrival)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status is Status.RUNNING:
                out.items.append((req, n))
                budget -= n
        if out.preempted:
            return out
        skipped = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting.popleft()
            if req.num_pending == 0:
                skipped.append(req)
                continue
            n = min(req.num_pending, budget)
            if not self._grow(req, req.num_computed + n):
                self.waiting.appendleft(req)
                break
            req.status = Status.RUNNING
            self.running.append(req)
            out.items.append((req, n))
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return out

    def _grow(self, req: Request, num_tokens: int) -> bool:
        extra = blocks_for(num_tokens) - len(req.blocks)
        if extra <= 0:
            return True
        if extra > self.allocator.num_free:
            return False
        req.blocks += self.allocator.allocate(extra)
        return True

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption: drop the KV, keep the outputs, requeue at the front."""
        self.running.remove(req)
        self.allocator.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)
