"""``torch.compile`` of a whole decoder forward: one graph per model, no break per layer.

The paged KV write, paged attention and MoE dispatch are registered custom ops
(:mod:`omniduplex.kernels.custom_ops`) that the layers call while being traced, so Dynamo sees the
embedding-to-final-norm forward as one graph (``fullgraph=True`` makes a break an error, not a silent
slowdown) and Inductor fuses the element-wise work between the GEMMs (RMSNorm, RoPE, SiLU·up, residual
adds) into a few C++ loops. Shapes are dynamic (``dynamic=True``): one graph serves every token count;
Dynamo still specialises a batch of exactly one token, so a decode of one sequence gets its own graph.
The first forward of each graph compiles it (tens of seconds on two cores), so serving stages compile
only when asked (stage option ``compile: true``).

Guards: Dynamo re-checks before every call that what it traced still holds; for a decoder that is ~1,000
checks on the model's own modules, parameters and globals (~0.4 ms of a 5 ms decode step here). Those never
change once a model is loaded and prepared, so :func:`keep_input_guards` keeps only the guards on the
forward's arguments (shapes, dtypes, ``capture_layer``, the batch) and the symbolic-shape guards, as vLLM's
compile wrapper does (``vllm/compilation/wrapper.py``). The price: the model must not be changed (modules,
parameters replaced, flags flipped) after its first compiled forward.
"""

from __future__ import annotations

import torch
from torch import nn


def keep_input_guards(entries) -> list[bool]:
    """Dynamo ``guard_filter_fn``: keep a guard unless it is on a global or on ``self`` (the model)."""
    return [not e.is_global and not e.name.startswith("self") for e in entries]


def compile_decoder(model: nn.Module) -> nn.Module:
    """Compile ``model.forward`` in place (``mode="max-autotune-no-cudagraphs"`` is not used: its GEMM
    autotuning takes minutes on a CPU) and return ``model``. Works for :class:`~omniduplex.models.layers
    .DecoderStack` and the models that wrap one (Thinker, Talker, unified LM).

    Raises:
        RuntimeError: (at the first forward) Dynamo cannot trace the forward as one graph.
    """
    # no "duck sizing": the block table's width may equal the sequence count + 1 by chance, and a guard on
    # that equality would recompile whenever it stops holding
    torch.fx.experimental._config.use_duck_shape = False
    model.forward = torch.compile(
        model.forward, dynamic=True, fullgraph=True, options={"guard_filter_fn": keep_input_guards}
    )
    return model
