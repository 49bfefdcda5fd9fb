"""Iteration-level scheduler (Orca, Yu et al. 2022; vLLM): which requests run this step, with how many tokens.

Every step: running requests first, oldest first, each taking its pending tokens (1 for a decode,
a chunk for a prefill) from the step's token budget; when KV blocks run out the youngest running
request is preempted (its blocks freed, recomputed later). Then waiting requests are admitted in
arrival order while budget, sequence slots and free blocks allow. Requests with nothing pending
(a Talker waiting for Thinker text) are skipped without losing their place. Background requests (a turn's
prefill hint while the user still speaks) are planned after all others, in the budget left and at most
:data:`BACKGROUND_TOKENS` rows a step (:data:`BACKGROUND_BESIDE` beside a prefill, none beside decode rows
alone; their prefill is chunked), so they never hold back a turn nor stretch a decode step.

With a :class:`.prefix_cache.PrefixCache`, a request admitted without KV (new, or preempted) first takes
the cached blocks of its longest matching prefix and is planned only for the rows after it; after each
forward the engine calls :meth:`Scheduler.computed` so completed blocks are registered for others.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.pipeline.engine.block_manager import BlockAllocator, blocks_for
from omniduplex.pipeline.engine.prefix_cache import PrefixCache
from omniduplex.pipeline.engine.request import Request, Status

BACKGROUND_TOKENS = 16
"""Rows of background requests (prefill hints) one step takes at most: a foreground request that arrives
during a step waits for at most this many background rows (one 16-token KV block; for the 1.5B on one
thread ~0.3 s of prefill where 64 hint rows at once took ~1-3 s on the shared 2-core host,
``omniduplex bench phone``)."""
BACKGROUND_BESIDE = 4
"""Rows of background requests a step with a foreground prefill takes at most. A step of decode rows alone
takes none: any prefill row beside them moves the step off the quantized one-call decode layer, and 4 or 16
hint rows beside one decode row made a 1.5B decode step ~4-5x longer (0.12-0.17 → 0.63-0.76 s, loaded
host)."""


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
        prefix_cache: reuse and register full blocks across requests (``None``: prefix caching off).
        background_tokens: most rows of background requests (:attr:`Request.background`) in one step.
    """

    def __init__(
        self,
        allocator: BlockAllocator,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        prefix_cache: PrefixCache | None = None,
        background_tokens: int = BACKGROUND_TOKENS,
    ) -> None:
        self.allocator = allocator
        self.prefix_cache = prefix_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_reused_tokens = 0  # rows taken from the prefix cache at admissions
        self.background_tokens = background_tokens
        self.background_beside = min(BACKGROUND_BESIDE, background_tokens)

    def add(self, req: Request) -> None:
        """Queue a request (with its CFG companion, if any).

        Raises ValueError for a duplicate id or a request that can never fit the cache.
        """
        for r in req.group:
            if r.request_id in self.requests:
                raise ValueError(f"duplicate request id {r.request_id!r}")
        need = sum(blocks_for(r.num_prompt + r.sampling.max_tokens) for r in req.group)
        if need > self.allocator.num_blocks:
            raise ValueError(
                f"request {req.request_id!r} needs {need} KV blocks; "
                f"the cache has {self.allocator.num_blocks}"
            )
        for r in req.group:
            self.requests[r.request_id] = r
        self.waiting.append(req)

    def finish(self, req: Request, status: Status) -> None:
        """Mark finished (stop, length or abort) and release its blocks (and its companion's) now."""
        if req.status.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        for r in req.group:
            self._release(r)
            r.status = status
            self.requests.pop(r.request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """The next step's plan: foreground requests as the module doc says, then background ones
        (:attr:`Request.background`) in the budget left: at most :attr:`background_tokens` rows of them in a
        step of their own, :attr:`background_beside` beside a prefill, none beside decode rows alone (a decode
        step keeps its fused one-row path and stays short; hints then wait for a step without decodes)."""
        out = ScheduledBatch()
        budget = self._plan_running(out, self.max_num_batched_tokens, background=False)
        if out.preempted:
            return out
        budget = self._admit(out, budget, background=False)
        decode_only = bool(out.items) and all(n == 1 and r.num_computed >= r.num_prompt for r, n in out.items)
        cap = 0 if decode_only else self.background_beside if out.items else self.background_tokens
        rest = min(budget, cap)
        if rest > 0:
            rest = self._plan_running(out, rest, background=True)
            if out.preempted:
                return out
            self._admit(out, rest, background=True)
        return out

    def _plan_running(self, out: ScheduledBatch, budget: int, background: bool) -> int:
        """Plan the running requests of one kind (``background`` or not) into ``out``; returns the budget
        left."""
        # oldest first, so the preemption victim (the youngest) is never one already planned this step
        self.running.sort(key=lambda r: r.arrival)
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not Status.RUNNING or req.background is not background:
                continue
            ns = self._chunk(req, budget, bool(out.items))
            if not any(ns):
                continue
            if req.draft_ids and not self._grow(req, ns):  # no room for the drafts' KV: decode one id
                req.draft_ids = []
                ns = self._chunk(req, budget, bool(out.items))
            while not self._grow(req, ns):
                victim = max(self.running, key=lambda r: r.arrival)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status is Status.RUNNING:
                out.items += [(r, n) for r, n in zip(req.group, ns) if n]
                budget -= sum(ns)
        return budget

    def _admit(self, out: ScheduledBatch, budget: int, background: bool) -> int:
        """Admit waiting requests of one kind in arrival order while budget, sequence slots and free blocks
        allow (the other kind keeps its place in the queue); returns the budget left."""
        skipped = []
        order = list(self.waiting)
        mine = deque(r for r in order if r.background is background)
        while mine and budget > 0 and len(self.running) < self.max_num_seqs:
            req = mine.popleft()
            reused = self._reuse_prefix(req)
            ns = self._chunk(req, budget, bool(out.items))
            if not any(ns):
                self._unreuse(reused)
                skipped.append(req)
                continue
            if not self._grow(req, ns):
                self._unreuse(reused)
                mine.appendleft(req)
                break
            for r in reused:
                self.num_reused_tokens += r.num_computed
                if r.num_cached_tokens < 0:
                    r.num_cached_tokens = r.num_computed
            for r in req.group:
                r.status = Status.RUNNING
            self.running.append(req)
            out.items += [(r, n) for r, n in zip(req.group, ns) if n]
            budget -= sum(ns)
        left = {id(r) for r in [*mine, *skipped]}
        self.waiting = deque(r for r in order if r.background is not background or id(r) in left)
        return budget

    @staticmethod
    def _chunk(req: Request, budget: int, others_planned: bool) -> list[int]:
        """Tokens to run per member of ``req.group``. A single request may take a prefill chunk, and so
        may a CFG request whose companion is not live yet (the companion waits); a live CFG pair runs
        whole (both members must reach their sampling point in the same step, the companion catching up
        on everything it skipped), waiting for a step with room unless nothing else is planned."""
        if req.companion is None:  # a speculating request: its pending row, then its drafts
            return [min(req.num_pending + len(req.draft_ids), budget)]
        if not req.companion_live:
            return [min(req.num_pending, budget), 0]
        ns = [r.num_pending for r in req.group]
        if not all(ns) or (sum(ns) > budget and others_planned):
            return [0, 0]
        return ns

    def _grow(self, req: Request, ns: list[int]) -> bool:
        extra = [blocks_for(r.num_computed + n) - len(r.blocks) for r, n in zip(req.group, ns)]
        if sum(max(0, e) for e in extra) > self.allocator.num_free:
            return False
        for r, e in zip(req.group, extra):
            if e > 0:
                r.blocks += self.allocator.allocate(e)
        return True

    def rollback(self, req: Request) -> None:
        """Drop the KV rows of ``req`` at and after ``req.num_computed`` (lowered by the caller: rejected
        speculative rows). Blocks past the kept rows go back to the pool; the block holding the last kept
        rows is made writable (unregistered if it was named in the prefix cache; if it is shared, it is left
        and its rows are recomputed)."""
        k, m = divmod(req.num_computed, BLOCK_SIZE)
        if m and k < len(req.blocks) and self.allocator.block_hash(req.blocks[k]) is not None:
            if self.allocator.refcount(req.blocks[k]) == 1:
                self.allocator.unregister(req.blocks[k])
            else:
                req.num_computed = k * BLOCK_SIZE
        keep = blocks_for(req.num_computed)
        if len(req.blocks) > keep:
            self.allocator.free(req.blocks[keep:][::-1])
            req.blocks = req.blocks[:keep]  # a new list: the step inputs rewrite its block table row
        full = req.num_computed // BLOCK_SIZE
        req.num_registered = min(req.num_registered, full)
        del req.block_hashes[full:]

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption of a whole group: drop the KV, keep the outputs, requeue first."""
        self.running.remove(req)
        self.num_preemptions += 1
        for r in req.group:
            self._release(r)
            r.draft_ids = []  # drafts follow a pending decode row only
            r.num_preemptions += 1
            r.status = Status.WAITING
        self.waiting.appendleft(req)

    def _release(self, r: Request) -> None:
        """Drop the request's KV: tail blocks first, so the LRU evicts a chain from its end (its partly
        filled last block stays findable with prefix caching)."""
        if self.prefix_cache is not None:
            self.prefix_cache.release(r)
        self.allocator.free(r.blocks[::-1])
        r.blocks = []
        r.num_computed = 0
        r.num_registered = 0

    def _reuse_prefix(self, req: Request) -> list[Request]:
        """Members of ``req.group`` without KV take their cached prefix; returns them (to undo, count)."""
        if self.prefix_cache is None:
            return []
        took = [r for r in req.group if not r.blocks and r.num_computed == 0]
        for r in took:
            self.prefix_cache.match(r)
        return took

    def _unreuse(self, reused: list[Request]) -> None:
        """Give back the prefix blocks of requests that were not admitted after all."""
        for r in reused:
            self._release(r)

    def computed(self, req: Request) -> None:
        """The engine ran rows of ``req``: register the blocks they completed in the prefix cache."""
        if self.prefix_cache is not None and req.blocks:
            self.prefix_cache.register(req)
