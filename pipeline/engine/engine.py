"""The continuous-batching engine: schedule → one batched forward over the flat token batch → sample → stream.

Model specifics (how input rows are embedded, what a sampled id produces downstream) live in a
:class:`ModelAdapter`; the engine knows only requests, KV blocks and logits.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch

from omniduplex.models.forward_batch import BLOCK_SIZE, ForwardBatch, allocate_kv_cache
from omniduplex.pipeline.engine.block_manager import BlockAllocator
from omniduplex.pipeline.engine.grammar import GrammarBank
from omniduplex.pipeline.engine.prefix_cache import PrefixCache
from omniduplex.pipeline.engine.request import Request, RequestOutput, Status
from omniduplex.pipeline.engine.sampler import SamplingBatch, sample
from omniduplex.pipeline.engine.scheduler import ScheduledBatch, Scheduler
from omniduplex.pipeline.engine.threads import ThreadGovernor


class ModelAdapter(Protocol):
    """What the engine needs from a model. Shapes: ``T`` flat tokens, ``B`` sampled rows."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    def input_embeds(self, items: list[tuple[Request, int]]) -> torch.Tensor:
        """Embeddings ``[T, hidden]`` of rows ``num_computed .. num_computed + n`` of every item."""

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        """Final hidden states ``[T, hidden]``; may record per-request side outputs."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, hidden]`` → ``[B, vocab]``."""

    def on_sampled(
        self, reqs: list[Request], tokens: torch.Tensor, hidden: torch.Tensor, finishing: list[bool]
    ) -> list[dict]:
        """Per-request extras for the step's outputs (e.g. the Talker's codec frame)."""


class Engine:
    """Continuous batching over a paged KV cache.

    Args:
        adapter: the model (Thinker, Talker, text LM) behind a :class:`ModelAdapter`.
        num_blocks: KV blocks of 16 tokens in the cache (per layer).
        max_num_seqs: most requests in one step.
        max_num_batched_tokens: token budget of one step.
        dtype, device: of the KV cache.
        enable_prefix_caching: share full KV blocks across requests with the same input prefix
            (:mod:`.prefix_cache`); the adapter may supply ``row_key(req, start, end) -> bytes | None``
            (content of input rows beyond their ids) and ``cacheable_rows(req) -> int`` (most leading rows
            whose computation may be skipped).
        adapt_threads: keep torch's intra-op threads at the cores other processes leave free
            (:class:`.threads.ThreadGovernor`; up to the count set when the engine is built). ``None``: on
            unless the environment sets ``OMNIDUPLEX_ADAPT_THREADS=0``.

    Counters: ``num_prefill_tokens`` (prompt rows run through the model, recomputations after preemption
    included), ``num_cached_tokens`` (prompt rows taken from the prefix cache, summed over requests at their
    first token).
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        num_blocks: int = 512,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        enable_prefix_caching: bool = True,
        adapt_threads: bool | None = None,
    ) -> None:
        self.adapter, self.device = adapter, torch.device(device)
        self.kv = allocate_kv_cache(
            adapter.num_layers, num_blocks, adapter.num_kv_heads, adapter.head_dim, dtype=dtype, device=device
        )
        allocator = BlockAllocator(num_blocks)
        cache = None
        if enable_prefix_caching:
            cache = PrefixCache(
                allocator, getattr(adapter, "row_key", None), getattr(adapter, "cacheable_rows", None)
            )
        self.scheduler = Scheduler(allocator, max_num_seqs, max_num_batched_tokens, cache)
        self.enable_prefix_caching = enable_prefix_caching
        self.num_prefill_tokens = 0
        self.num_cached_tokens = 0
        if adapt_threads is None:
            adapt_threads = os.environ.get("OMNIDUPLEX_ADAPT_THREADS", "1") != "0"
        self.threads = ThreadGovernor() if adapt_threads else None
        self._counts = torch.zeros((0, adapter.vocab_size), dtype=torch.int32, device=device)
        self._free_slots: list[int] = []
        self.num_steps = 0
        self.grammars = GrammarBank(adapter.vocab_size)  # constrained decoding (SamplingParams.grammar)

    # -- request lifecycle -------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue ``req``. Raises ValueError (duplicate id, prompt larger than the cache, bad ids, a grammar
        for another vocabulary)."""
        bad = [t for t in req.prompt_ids if not 0 <= t < self.adapter.vocab_size]
        if bad and req.prompt_embeds is None:
            raise ValueError(
                f"request {req.request_id!r}: token id {bad[0]} outside vocabulary "
                f"[0, {self.adapter.vocab_size})"
            )
        self.grammars.check(req)
        self.scheduler.add(req)
        for r in req.group:
            r.slot = self._take_slot()
        if req.sampling.seed is None:
            req.sampling.seed = int(torch.randint(0, 2**62, (1,)).item())
        if req.companion is not None:
            req.companion.sampling.seed = req.sampling.seed
        if hasattr(self.adapter, "on_added"):
            self.adapter.on_added(req)

    def abort(self, request_id: str) -> bool:
        """Abort a request wherever it is; its KV blocks are free when this returns. False if unknown."""
        req = self.scheduler.requests.get(request_id)
        if req is None or req.is_companion:
            return False
        self._finish(req, Status.FINISHED_ABORTED)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def _take_slot(self) -> int:
        if not self._free_slots:
            n = self._counts.shape[0]
            grow = max(8, n)
            self._counts = torch.cat((self._counts, self._counts.new_zeros((grow, self._counts.shape[1]))))
            self._free_slots = list(range(n + grow - 1, n - 1, -1))
        slot = self._free_slots.pop()
        self._counts[slot].zero_()
        return slot

    def _finish(self, req: Request, status: Status) -> None:
        self.scheduler.finish(req, status)
        self.grammars.release(req.request_id)
        for r in req.group:
            if r.slot >= 0:
                self._free_slots.append(r.slot)
                r.slot = -1

    # -- one iteration -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler iteration; returns the outputs of requests that sampled or finished."""
        plan = self.scheduler.schedule()
        if not plan.items:
            return []
        self.num_steps += 1
        if self.threads is not None:
            self.threads.update()
        batch = self._build_batch(plan)
        x = self.adapter.input_embeds(plan.items)
        hidden = self.adapter.forward(x, batch, self.kv)
        rows, reqs = [], []
        end = 0
        for req, n in plan.items:
            end += n
            prompt_rows = max(0, min(req.num_computed + n, req.num_prompt) - req.num_computed)
            req.num_prefill_computed += prompt_rows
            self.num_prefill_tokens += prompt_rows
            req.num_computed += n
            self.scheduler.computed(req)
            if req.num_pending == 0:
                rows.append(end - 1)
                reqs.append(req)
        if not reqs:
            return []
        h = hidden[rows]
        if hasattr(self.adapter, "decode"):  # models that sample several streams / pair CFG rows
            token_list, finishing, extras = self.adapter.decode(reqs, h)
        else:
            token_list, finishing, extras = self._sample(reqs, h)
        outs = []
        ran = {id(r) for r in reqs}
        for req, tok, fin, extra in zip(reqs, token_list, finishing, extras):
            req.output_ids.append(tok)
            if req.is_companion:
                continue  # hidden: it follows its main request, which reports and finishes both
            if req.companion is not None and id(req.companion) not in ran:
                req.companion.output_ids.append(tok)  # not live yet: it catches up on these later
            reason = None
            if fin:
                status = (
                    Status.FINISHED_STOPPED if tok in req.sampling.stop_token_ids else Status.FINISHED_LENGTH
                )
                self._finish(req, status)
                reason = status.value
            out = RequestOutput(req.request_id, [tok], fin, reason, extra)
            if len(req.output_ids) == 1:
                out.num_cached_tokens = max(0, req.num_cached_tokens)
                self.num_cached_tokens += out.num_cached_tokens
            outs.append(out)
        return outs

    def _sample(self, reqs: list[Request], h: torch.Tensor) -> tuple[list[int], list[bool], list[dict]]:
        """Primary-token sampling of single-stream models: logits → penalties → sample → adapter extras."""
        logits = self.adapter.compute_logits(h)
        self.grammars.mask_(reqs, logits)  # rows of requests with a grammar only
        tokens = sample(logits, self._sampling_batch(reqs))
        slots = torch.tensor([r.slot for r in reqs], device=self.device)
        self._counts.index_put_((slots, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
        token_list = tokens.tolist()
        accepted = self.grammars.accept(reqs, token_list)
        finishing = [
            tok in r.sampling.stop_token_ids or len(r.output_ids) + 1 >= r.sampling.max_tokens or not ok
            for r, tok, ok in zip(reqs, token_list, accepted)
        ]
        return token_list, finishing, self.adapter.on_sampled(reqs, tokens, h, finishing)

    def _build_batch(self, plan: ScheduledBatch) -> ForwardBatch:
        positions, slots, tables, seq_lens, qsl = [], [], [], [], [0]
        for req, n in plan.items:
            start = req.num_computed
            pos = range(start, start + n)
            positions.extend(pos)
            blocks = req.blocks
            slots.extend(blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in pos)
            tables.append(blocks)
            seq_lens.append(start + n)
            qsl.append(qsl[-1] + n)
        width = max(len(t) for t in tables)
        dev = self.device
        return ForwardBatch(
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(
                [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=dev
            ),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            max_seq_len=max(seq_lens),
            max_query_len=max(n for _, n in plan.items),
        )

    def _sampling_batch(self, reqs: list[Request]) -> SamplingBatch:
        dev = self.device
        sps = [r.sampling for r in reqs]
        slots = torch.tensor([r.slot for r in reqs], device=dev)
        suppress = None
        if any(sp.never_sampled for sp in sps):
            rows = [i for i, sp in enumerate(sps) for _ in sp.never_sampled]
            cols = [t for sp in sps for t in sp.never_sampled]
            suppress = torch.zeros((len(reqs), self.adapter.vocab_size), dtype=torch.bool, device=dev)
            suppress[rows, cols] = True
        penalised = any(sp.repetition_penalty != 1.0 for sp in sps)
        return SamplingBatch(
            temperature=torch.tensor([sp.temperature for sp in sps], dtype=torch.float32, device=dev),
            top_k=torch.tensor([sp.top_k for sp in sps], dtype=torch.int64, device=dev),
            top_p=torch.tensor([sp.top_p for sp in sps], dtype=torch.float32, device=dev),
            repetition_penalty=torch.tensor(
                [sp.repetition_penalty for sp in sps], dtype=torch.float32, device=dev
            ),
            seeds=torch.tensor([sp.seed for sp in sps], dtype=torch.int64, device=dev),
            counters=torch.tensor([len(r.output_ids) for r in reqs], dtype=torch.int64, device=dev),
            counts=self._counts[slots] if penalised else None,
            suppress=suppress,
        )
