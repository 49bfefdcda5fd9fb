"""The continuous-batching engine of an LM stage, built the one way every such stage builds it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniduplex.pipeline.engine.engine import Engine, ModelAdapter


@dataclass(frozen=True)
class EngineSettings:
    """The engine settings every LM stage's worker takes (a stage's config gives them in serving).

    ``num_blocks``: KV cache blocks; ``max_num_seqs``: most requests per step; ``max_num_batched_tokens``:
    most tokens per step (prefill chunks included); ``enable_prefix_caching``: reuse the KV of a prompt
    prefix seen before; ``cuda_graphs``: decode steps replay as CUDA graphs on a CUDA device. See
    :class:`Engine` for each.
    """

    num_blocks: int = 1024
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True

    def build(
        self, adapter: ModelAdapter, weight: torch.Tensor, name: str, speculator: object | None = None
    ) -> Engine:
        """:func:`stage_engine` with these settings."""
        return stage_engine(
            adapter, weight, name, self.num_blocks, self.max_num_seqs, self.max_num_batched_tokens,
            self.enable_prefix_caching, self.cuda_graphs, speculator,
        )


def stage_engine(
    adapter: ModelAdapter,
    weight: torch.Tensor,
    name: str,
    num_blocks: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enable_prefix_caching: bool,
    cuda_graphs: bool,
    speculator: object | None = None,
) -> Engine:
    """An :class:`Engine` over ``adapter`` whose KV cache takes the dtype and device of ``weight`` (the
    model's output head); ``cuda_graphs``: decode steps replay as CUDA graphs on a CUDA device
    (``graphs="auto"``), else never (``"off"``); ``speculator``: speculative decoding
    (:mod:`omniduplex.pipeline.engine.speculative`), none by default. The other arguments are the
    engine's own."""
    return Engine(
        adapter,
        num_blocks,
        max_num_seqs,
        max_num_batched_tokens,
        dtype=weight.dtype,
        device=weight.device,
        enable_prefix_caching=enable_prefix_caching,
        graphs="auto" if cuda_graphs else "off",
        name=name,
        speculator=speculator,
    )
