"""The continuous-batching engine: schedule → one batched forward over the flat token batch → sample → stream.

Model specifics (how input rows are embedded, what a sampled id produces downstream) live in a
:class:`ModelAdapter`; the engine knows only requests, KV blocks and logits. A step's metadata is built on
the host from persistent buffers and sent with one copy (:mod:`.step_inputs`, :mod:`.sampling_tables`);
decode-only steps replay a CUDA graph of their batch-size bucket where the adapter allows it
(:mod:`.decode_graphs`).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import torch

from omniduplex.kernels import triton_ops
from omniduplex.models.forward_batch import BLOCK_SIZE, ForwardBatch, allocate_kv_cache
from omniduplex.pipeline.engine.block_manager import BlockAllocator
from omniduplex.pipeline.engine.decode_graphs import DecodeGraphs, is_decode_only, supports_graphs
from omniduplex.pipeline.engine.grammar import GrammarBank
from omniduplex.pipeline.engine.graph_runner import make_backend, resolve_mode
from omniduplex.pipeline.engine.prefix_cache import PrefixCache
from omniduplex.pipeline.engine.request import Request, RequestOutput, Status
from omniduplex.pipeline.engine.sampler import sample
from omniduplex.pipeline.engine.sampling_tables import SamplingTables
from omniduplex.pipeline.engine.scheduler import Scheduler
from omniduplex.pipeline.engine.speculative import Speculator
from omniduplex.pipeline.engine.step_inputs import StepInputs
from omniduplex.pipeline.engine.threads import ThreadGovernor

log = logging.getLogger(__name__)


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
            (:class:`.threads.ThreadGovernor`; up to the count set when the engine is built; it does nothing
            with one thread).
        graphs: decode steps as graphs per batch-size bucket (:mod:`.graph_runner` modes): ``auto`` (CUDA
            graphs on a CUDA device, none on the CPU, where the C++ decode kernels and ``torch.compile``
            are the fast paths and padding to a bucket would only add work), ``cuda``, ``twin`` (the CPU
            twin: tests and the benchmark's dry run) or ``off``. Needs an adapter with ``decode_forward``;
            others run eagerly. Captured here, when the engine is built.
        max_model_len: longest context (tokens) a replayed decode step holds (the static block table's
            width); default ``num_blocks * 16``, at most the adapter's ``max_position_embeddings``. Longer
            requests still run, eagerly.
        name: the engine's name in logs (``"thinker"``).
        speculator: speculative decoding (:class:`.speculative.Speculator`; ``None``: off). Needs an adapter
            with ``supports_speculation`` true (its sampled ids make no extras) and no ``decode`` of its own.

    Counters: ``num_prefill_tokens`` (prompt rows run through the model, recomputations after preemption
    included), ``num_cached_tokens`` (prompt rows taken from the prefix cache, summed over requests at their
    first token), ``host_s`` (host time building eager steps' inputs: metadata, upload, embeddings; replayed
    steps: ``self.graphs.host_s``).
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
        adapt_threads: bool = True,
        graphs: str = "auto",
        max_model_len: int | None = None,
        name: str = "engine",
        speculator: Speculator | None = None,
    ) -> None:
        self.adapter, self.device, self.name = adapter, torch.device(device), name
        if speculator is not None and (
            not getattr(adapter, "supports_speculation", False) or hasattr(adapter, "decode")
        ):
            raise ValueError(f"{name}: this model adapter does not support speculative decoding")
        self.spec = speculator
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
        self.threads = ThreadGovernor() if adapt_threads else None
        for module in vars(adapter).values():  # fused norm/RoPE/SiLU Triton kernels for weights on CUDA
            if isinstance(module, torch.nn.Module):
                triton_ops.attach(module)
        mode = resolve_mode(graphs, self.device)
        mirror = mode == "twin"  # the twin exercises the host-to-device copies too
        self.inputs = StepInputs(self.device, max_num_seqs, max_num_batched_tokens, mirror=mirror)
        self.sampling = SamplingTables(adapter.vocab_size, self.device, mirror=mirror)
        self._num_slots = 0
        self._free_slots: list[int] = []
        self.num_steps = 0
        self.host_s = 0.0
        self.grammars = GrammarBank(adapter.vocab_size)  # constrained decoding (SamplingParams.grammar)
        self.graphs: DecodeGraphs | None = None
        if mode != "off" and supports_graphs(adapter):
            self._capture(mode, max_num_seqs, num_blocks, max_model_len, dtype)

    def _capture(self, mode: str, max_num_seqs: int, num_blocks: int, max_model_len, dtype) -> None:
        """Capture the decode graphs and the adapter's own (the Talker's code predictor); one log line."""
        backend = make_backend(mode, self.device)
        if max_model_len is None:
            limit = getattr(self.adapter, "max_position_embeddings", None) or num_blocks * BLOCK_SIZE
            max_model_len = min(num_blocks * BLOCK_SIZE, limit)
        self.graphs = DecodeGraphs(
            f"{self.name} decode",
            self.adapter,
            self.kv,
            self.inputs,
            backend,
            max_num_seqs,
            max_model_len,
            self.adapter.hidden_size,
            dtype,
        )
        runners = [self.graphs.runner]
        if hasattr(self.adapter, "capture_graphs"):
            runners += self.adapter.capture_graphs(backend, max_num_seqs)
        log.info(
            "%s: %s graphs captured in %.2f s, %.1f MiB (%s)",
            self.name,
            backend.name,
            sum(r.capture_s for r in runners),
            sum(r.capture_bytes for r in runners) / 2**20,
            "; ".join(f"{r.name}: batch sizes {','.join(map(str, r.buckets))}" for r in runners),
        )

    def graph_stats(self) -> dict[str, int]:
        """``cuda_graph_hits`` / ``cuda_graph_misses`` over this engine's runners (empty without graphs)."""
        if self.graphs is None:
            return {}
        runners = [self.graphs.runner] + list(getattr(self.adapter, "graph_runners", lambda: [])())
        return {
            "cuda_graph_hits": sum(r.hits for r in runners),
            "cuda_graph_misses": sum(r.misses for r in runners),
        }

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
        for r in req.group:
            self.sampling.set(r.slot, r.sampling)
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
            n = self._num_slots
            grow = max(8, n)
            self._num_slots = n + grow
            self.sampling.grow(self._num_slots)
            self._free_slots = list(range(n + grow - 1, n - 1, -1))
        return self._free_slots.pop()

    def _finish(self, req: Request, status: Status) -> None:
        self.scheduler.finish(req, status)
        if self.spec is not None:
            self.spec.release(req.request_id)
        self.grammars.release(req.request_id)
        for r in req.group:
            if r.slot >= 0:
                self.inputs.tables.release(r.slot)
                self._free_slots.append(r.slot)
                r.slot = -1

    # -- one iteration -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler iteration; returns the outputs of requests that sampled or finished."""
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)
        plan = self.scheduler.schedule()
        if not plan.items:
            return []
        self.num_steps += 1
        if self.threads is not None:
            self.threads.update()
        hidden = None
        if self.graphs is not None and is_decode_only(plan.items):
            hidden = self.graphs.run(plan.items)
        if hidden is None:
            t0 = time.perf_counter()
            if self.spec is not None and all(r.num_pending == 1 for r, _ in plan.items):
                batch = self.inputs.row_batch(plan.items)  # decodes and drafts: one query a row
            else:
                batch = self.inputs.eager_batch(plan.items)
            x = self.adapter.input_embeds(plan.items)
            self.host_s += time.perf_counter() - t0
            hidden = self.adapter.forward(x, batch, self.kv)
        rows, reqs, speculated = [], [], []
        end = 0
        for req, n in plan.items:
            end += n
            if n > req.num_pending:  # its pending row and n - 1 draft rows: verified below
                speculated.append((req, end - n, n))
                continue
            prompt_rows = max(0, min(req.num_computed + n, req.num_prompt) - req.num_computed)
            req.num_prefill_computed += prompt_rows
            self.num_prefill_tokens += prompt_rows
            req.num_computed += n
            self.scheduler.computed(req)
            if req.num_pending == 0:
                rows.append(end - 1)
                reqs.append(req)
        outs = self._speculated(speculated, hidden) if speculated else []
        if not reqs:
            return outs
        h = hidden if len(rows) == hidden.shape[0] else hidden[rows]  # decode steps: every row samples
        if hasattr(self.adapter, "decode"):  # models that sample several streams / pair CFG rows
            token_list, finishing, extras = self.adapter.decode(reqs, h)
        else:
            token_list, finishing, extras = self._sample(reqs, h)
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
            if req.num_draft_tokens:
                out.num_draft_tokens, out.num_accepted_tokens = req.num_draft_tokens, req.num_accepted_tokens
            outs.append(out)
        return outs

    def _speculated(self, items: list[tuple[Request, int, int]], hidden: torch.Tensor) -> list[RequestOutput]:
        """Verify the drafts of speculating requests (``(request, first row, rows)``), append the emitted ids
        up to a stop id or ``max_tokens``, and roll each request's KV back to the rows it kept."""
        outs = []
        for (req, _, _), emitted in zip(items, self.spec.verify(self.adapter, items, hidden)):
            sp, new, status = req.sampling, [], None
            for tok in emitted:
                req.output_ids.append(tok)
                new.append(tok)
                if tok in sp.stop_token_ids or len(req.output_ids) >= sp.max_tokens:
                    status = Status.FINISHED_STOPPED if tok in sp.stop_token_ids else Status.FINISHED_LENGTH
                    break
            req.num_computed += len(new)  # the pending row and the kept drafts; the last id is pending
            if status is not None:
                self._finish(req, status)
            else:
                self.scheduler.rollback(req)
                self.scheduler.computed(req)
            out = RequestOutput(req.request_id, new, status is not None, status and status.value)
            out.num_draft_tokens, out.num_accepted_tokens = req.num_draft_tokens, req.num_accepted_tokens
            outs.append(out)
        return outs

    def _sample(self, reqs: list[Request], h: torch.Tensor) -> tuple[list[int], list[bool], list[dict]]:
        """Primary-token sampling of single-stream models: logits → penalties → sample → adapter extras."""
        logits = self.adapter.compute_logits(h)
        self.grammars.mask_(reqs, logits)  # rows of requests with a grammar only
        sb, slots, penalised = self.sampling.batch(reqs)
        tokens = sample(logits, sb)
        if penalised:
            self.sampling.count(slots, tokens)
        token_list = tokens.tolist()
        accepted = self.grammars.accept(reqs, token_list)
        finishing = [
            tok in r.sampling.stop_token_ids or len(r.output_ids) + 1 >= r.sampling.max_tokens or not ok
            for r, tok, ok in zip(reqs, token_list, accepted)
        ]
        return token_list, finishing, self.adapter.on_sampled(reqs, tokens, h, finishing)
