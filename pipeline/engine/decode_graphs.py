"""The engine's decode step as a graph per batch-size bucket (:mod:`.graph_runner`), eager steps unchanged.

A step is replayed when it is decode-only (one row per request, every row past its prompt: no prompt-row
side outputs such as the Thinker's captured hidden states), a bucket holds its batch, and no request holds
more KV blocks than the static block table is wide. Its inputs go into the static buffers of
:meth:`.step_inputs.StepInputs.setup_graph` (one host-to-device copy), the rows beyond the batch as padding
(slot -1: no KV write; one cached token read from block 0), and the graph of the bucket is replayed; the
final hidden states are the first rows of its static output. Prefill and mixed steps run eagerly.

The adapter opts in with ``decode_forward(x, batch, kv) -> hidden`` (a pure forward: nothing recorded) and
either ``decode_ids(items) -> ids`` with ``embed_ids(ids) -> x`` (token-id models: the embedding runs inside
the graph, the ids travel with the metadata) or its ``input_embeds(items)`` (embedding models: rows copied
into a static ``[max_batch, hidden]`` buffer).

Host time: :attr:`DecodeGraphs.host_s` sums, over replayed steps, the wall time from the start of
:meth:`DecodeGraphs.run` to the return of the replay launch (inputs gathered and written, the one copy
enqueued, ``graph.replay()`` returned; no device sync): the host's share of a replayed step.
"""

from __future__ import annotations

import time

import torch

from omniduplex.kernels import moe
from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.pipeline.engine.graph_runner import GraphRunner, bucket_sizes
from omniduplex.pipeline.engine.request import Request
from omniduplex.pipeline.engine.step_inputs import StepInputs


def supports_graphs(adapter) -> bool:
    """Whether ``adapter`` has the pure decode forward a graph captures."""
    return callable(getattr(adapter, "decode_forward", None))


def is_decode_only(items: list[tuple[Request, int]]) -> bool:
    """One row per request, each past its prompt."""
    return all(n == 1 and r.num_computed >= r.num_prompt for r, n in items)


class DecodeGraphs:
    """Decode steps of ``adapter`` replayed per bucket.

    Args:
        name: the runner's name in the log (``"thinker decode"``).
        adapter: see the module docstring.
        kv: the engine's KV cache (per layer ``(k, v)``).
        inputs: the engine's :class:`StepInputs` (its static decode buffers are allocated here).
        backend: from :func:`.graph_runner.make_backend`.
        max_num_seqs: the largest batch (buckets up to it, :func:`.graph_runner.bucket_sizes`; MoE models
            too: :func:`omniduplex.kernels.moe.sync_free` dispatches any batch without a host sync).
        max_model_len: the longest context (tokens) a replayed step may hold; longer requests run eagerly.
        hidden_size, dtype: of the adapter's input embeddings (embedding models).
    """

    def __init__(
        self,
        name: str,
        adapter,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        inputs: StepInputs,
        backend,
        max_num_seqs: int,
        max_model_len: int,
        hidden_size: int,
        dtype: torch.dtype,
    ) -> None:
        self.adapter, self.kv, self.inputs = adapter, kv, inputs
        self.runner = GraphRunner(name, backend, bucket_sizes(max_num_seqs))
        self.width = max(1, -(-max_model_len // BLOCK_SIZE))
        top = self.runner.buckets[-1]
        inputs.setup_graph(top, self.width)
        self.use_ids = callable(getattr(adapter, "decode_ids", None))
        self.x = None if self.use_ids else torch.zeros((top, hidden_size), dtype=dtype, device=inputs.device)
        self.host_s = 0.0
        with torch.no_grad():
            self.runner.capture(self._callable)

    def _callable(self, bucket: int):
        ids, batch = self.inputs.graph_batch(bucket)
        x = None if self.use_ids else self.x[:bucket]
        adapter, kv = self.adapter, self.kv

        def step() -> torch.Tensor:
            with moe.sync_free():
                return adapter.decode_forward(adapter.embed_ids(ids) if x is None else x, batch, kv)

        return step

    def static_buffers(self) -> list[torch.Tensor]:
        """Every static input and output tensor (tests check their data pointers never change)."""
        bufs = [self.inputs.graph.device_buffer, self.inputs.graph.host_buffer]
        bufs += [out for _, out in self.runner.graphs.values()]
        return bufs + ([] if self.x is None else [self.x])

    def run(self, items: list[tuple[Request, int]]) -> torch.Tensor | None:
        """Final hidden states ``[n, hidden]`` of a decode-only step (a view of the static output, valid until
        the next replay), or ``None`` when it must run eagerly (counted as a miss)."""
        t0 = time.perf_counter()
        n = len(items)
        bucket = self.runner.bucket_for(n)
        ids = self.adapter.decode_ids(items) if self.use_ids and bucket is not None else None
        if bucket is None or not self.inputs.fill_decode(items, bucket, ids):
            self.runner.miss()
            return None
        if self.x is not None:
            self.x[:n].copy_(self.adapter.input_embeds(items))
        out = self.runner.replay(bucket)
        self.host_s += time.perf_counter() - t0
        return out[:n]
