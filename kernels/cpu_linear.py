"""bf16 linear layers on a CPU with weights prepacked once for oneDNN (AMX / AVX512-BF16 GEMM kernels).

``F.linear`` on bf16 CPU tensors hands oneDNN a plain row-major weight, which it reorders into its blocked
layout on every call; for the small GEMMs of a decode step (a few to a few dozen rows) the reorder costs
as much as the product. Reordering once at load time (``mkldnn._reorder_linear_weight``) and calling
``mkldnn._linear_pointwise`` on the packed weight is what Inductor's freezing pass does for bf16 linears
(``torch/_inductor/fx_passes/mkldnn_fusion.py``) and what vLLM's CPU backend does with its oneDNN GEMMs.
Measured here (AMX, 2 threads, 1024×512 weight): 1 row 58 → 26 µs, 32 rows 65 → 36 µs; fp32 took 28 and
368 µs.

oneDNN builds (JIT-compiles) a kernel per input row count the first time it sees it, ~3 ms here against
0.3 ms for the product itself; with MoE routing every step has new per-expert row counts. Rows are
therefore padded up to a few buckets (:func:`bucket_rows`) so the kernels built stay bounded and reused,
and :func:`warm_up` builds them all at start-up, as vLLM's warm-up run does for its kernels.

Cost: the packed copy sits beside the plain weight (which stays: tied embeddings, ``state_dict`` and code
that reads ``.weight`` keep working), so packed linears hold their weights twice.
"""

from __future__ import annotations

import types

import torch
from torch import nn


def can_pack(weight: torch.Tensor) -> bool:
    """True for a bf16 CPU weight on a CPU whose oneDNN has native bf16 (AMX or AVX512-BF16)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` bf16 ``[out, in]`` → an opaque oneDNN tensor for :func:`packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())


def bucket_rows(m: int) -> int:
    """Rows a GEMM of ``m`` rows is padded to: exact up to 8, then multiples of 8 up to 64, of 64 up to
    1024, of 256 beyond (at most 8 + 7 + 15 kernels per weight shape up to 1024 rows)."""
    if m <= 8:
        return m
    step = 8 if m <= 64 else 64 if m <= 1024 else 256
    return -(-m // step) * step


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` bf16 ``[T, in]`` @ packed ``[out, in]``ᵀ (+ ``bias``) → bf16 ``[T, out]``, with ``T`` padded to
    :func:`bucket_rows` inside (zero rows, dropped from the result)."""
    m = x.shape[0]
    b = bucket_rows(m)
    if b != m:
        padded = x.new_zeros((b, x.shape[1]))
        padded[:m] = x
        x = padded
    y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
    return y[:m] if b != m else y


PACKED: list[torch.Tensor] = []
"""Every packed weight of the process, by key: the compiled graph passes a key to the custom op
(``omniduplex::packed_linear``), since oneDNN's opaque tensors cannot be traced."""


def register(packed: torch.Tensor) -> int:
    """Keep ``packed`` in :data:`PACKED` and, where the C++ kernels are loaded, in their registry under the
    same key (:mod:`.cpu_ops`); returns the key."""
    from omniduplex.kernels import cpu_ops

    PACKED.append(packed)
    key = len(PACKED) - 1
    if cpu_ops.loaded():
        cpp_key = torch.ops.omniduplex_cpu.register_packed(packed)
        if cpp_key != key:
            raise RuntimeError(f"packed-weight registries out of step: key {key} here, {cpp_key} in C++")
    return key


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    if self.packed_in_cpp:
        y = torch.ops.omniduplex_cpu.packed_linear(rows, self.packed_key, self.bias, self.out_features)
    elif torch.compiler.is_compiling():  # registered by custom_ops.py (imported by kernels/__init__.py)
        y = torch.ops.omniduplex.packed_linear.default(rows, self.packed_key, self.bias, self.out_features)
    else:
        y = packed_linear(rows, self.packed_weight, self.bias)
    return y.view(*lead, y.shape[-1])


def warm_up(model: nn.Module, max_rows: int) -> int:
    """Build oneDNN's kernel for every row bucket up to ``max_rows`` of every packed weight shape of
    ``model`` (run once after :func:`prepack_linears`, before serving); returns the number of GEMMs run."""
    packed: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for mod in model.modules():
        if isinstance(mod, nn.Linear) and hasattr(mod, "packed_weight"):
            packed.setdefault((tuple(mod.weight.shape), mod.bias is not None), (mod.packed_weight, mod.bias))
        for w, p in getattr(mod, "packed_pairs", lambda: [])():
            packed.setdefault((tuple(w.shape), False), (p, None))
    sizes = sorted({bucket_rows(m) for m in range(1, max_rows + 1)})
    n = 0
    with torch.inference_mode():
        for (shape, _), (p, bias) in packed.items():
            for m in sizes:
                packed_linear(torch.zeros((m, shape[1]), dtype=torch.bfloat16), p, bias)
                n += 1
    return n


def prepack_linears(model: nn.Module) -> int:
    """Prepare ``model`` for CPU serving, in place: its attention and MoE go onto our C++ kernels where they
    can be built (:func:`.cpu_ops.attach`), and every bf16 ``nn.Linear`` (and the MoE experts' weights, via
    their ``prepack()``) is packed for oneDNN. Returns how many weights were packed (0 where
    :func:`can_pack` says no, e.g. fp32 or no native bf16). Call after the model has its final dtype and
    device: a later ``.to()`` leaves stale packed copies."""
    from omniduplex.kernels import cpu_ops

    cpu_ops.attach(model)  # before packing: the C++ registry must see every packed weight
    n = 0
    for mod in model.modules():
        if isinstance(mod, nn.Linear) and can_pack(mod.weight):
            mod.packed_weight = pack(mod.weight)
            mod.packed_key = register(mod.packed_weight)
            mod.packed_in_cpp = cpu_ops.loaded()
            mod.forward = types.MethodType(_packed_forward, mod)
            n += 1
        elif hasattr(mod, "prepack") and callable(mod.prepack):
            n += mod.prepack()
    return n
