"""The continuous-batching engine of an LM stage, built the one way every such stage builds it."""

from __future__ import annotations

import torch

from omniduplex.pipeline.engine.engine import Engine, ModelAdapter


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
