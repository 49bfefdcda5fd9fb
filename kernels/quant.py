"""Weight-only quantized matmuls on GGUF blocks (``csrc/quant_ops.cpp``), built once per machine.

Ops (namespace ``torch.ops.omniduplex_quant``):

- ``qmatmul(x [T, K] float, w uint8 [N, row_bytes], type, K) -> [T, N] fp32``: ``x @ dequant(w).T`` with
  ``w`` kept in its GGML blocks (types :data:`TYPES`); activations are quantised to int8 per 32 values on
  the fly (as llama.cpp's CPU path does), so the result differs from the fp32 product by that rounding.
- ``dequantize_rows(w, type, K, ids int64 [R]) -> [R, K] fp32``: exactly ``gguf.quants.dequantize`` of
  those rows (embedding lookup).

The build is like :mod:`.cpu_ops` (``torch.utils.cpp_extension``, ``-O3 -march=native``, under an flock,
one build per CPU kind and source); the code path (fused AVX2+FMA kernels, with AVX512-VNNI's dpbusd where
the CPU has it, or portable scalar code) follows the build's ``-march=native``, and :func:`isa` names it.
Results do not depend on the batch: row ``t`` of a ``[T, K]`` input gives exactly the ``[1, K]`` result.
``OMNIDUPLEX_QUANT_ISA=scalar`` builds the portable path
(for tests of the fallback).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import torch

from omniduplex.kernels.cpu_ops import _cpu_flags, build_extension

SOURCE = Path(__file__).with_name("csrc") / "quant_ops.cpp"
ISA_ENV = "OMNIDUPLEX_QUANT_ISA"
TYPES = {"Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
"""GGML type name → id (``ggml.h``) of the formats our kernels take."""
BLOCKS = {3: (32, 20), 6: (32, 22), 8: (32, 34), 12: (256, 144), 14: (256, 210)}
"""GGML type id → (values per block, bytes per block) (``ggml-common.h``)."""

_lock = threading.Lock()
_loaded: dict[str, bool] = {}


class QuantBuildError(RuntimeError):
    """The quant extension could not be compiled or loaded (message: the compiler's reason)."""


def _flags() -> list[str]:
    if os.environ.get(ISA_ENV, "").strip() == "scalar":
        return ["-O3", "-march=x86-64", "-mno-avx", "-mno-avx2", "-ffp-contract=off"]
    return ["-O3", "-march=native", "-ffp-contract=off"]


def load() -> None:
    """Build (first call on this machine) and load the extension; idempotent and thread-safe.

    Raises:
        QuantBuildError: compiler or ninja missing, or the build failed.
    """
    with _lock:
        if _loaded.get("ok") or hasattr(torch.ops.omniduplex_quant, "qmatmul"):
            _loaded["ok"] = True
            return
        h = hashlib.sha1(" ".join(sorted(_cpu_flags())).encode())
        h.update(SOURCE.read_bytes())
        h.update(" ".join(_flags()).encode())
        name = f"omniduplex_quant_ops_{h.hexdigest()[:10]}"
        try:
            what = "building the C++ quantized-matmul kernels"
            build_extension(name, [str(SOURCE)], [*_flags(), "-fopenmp"], what)
        except (OSError, RuntimeError, ImportError) as e:
            raise QuantBuildError(f"building {SOURCE.name} failed: {e}") from e

        @torch.library.register_fake("omniduplex_quant::qmatmul")
        def _(x, w, type, in_features):
            return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32)

        _loaded["ok"] = True


def isa() -> str:
    """The code path the extension was built with: ``avx2-vnni``, ``avx2`` or ``scalar``."""
    load()
    return bytes(torch.ops.omniduplex_quant.isa(torch.empty(0)).tolist()).decode()


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one weight row of ``in_features`` values in GGML type ``qtype``.

    Raises:
        ValueError: an unsupported type, or ``in_features`` not a multiple of its block size.
    """
    if qtype not in BLOCKS:
        raise ValueError(f"GGML type id {qtype} is not supported (supported: {TYPES})")
    values, nbytes = BLOCKS[qtype]
    if in_features % values:
        raise ValueError(f"{in_features} values are not a whole number of {values}-value blocks")
    return in_features // values * nbytes


def qmatmul(x: torch.Tensor, w: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """``x`` ``[T, K]`` × quantized ``w`` ``[N, row_bytes]`` → ``[T, N]`` fp32 (see the module doc)."""
    load()
    return torch.ops.omniduplex_quant.qmatmul(x, w, qtype, in_features)


def dequantize_rows(w: torch.Tensor, qtype: int, in_features: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of quantized ``w`` as fp32 ``[len(ids), K]``, bit-equal to ``gguf.quants.dequantize``."""
    load()
    return torch.ops.omniduplex_quant.dequantize_rows(w, qtype, in_features, ids)
