"""``omniduplex bench quant-linear``: the CPU matmul kernels a decode step's linear layers can run on, side by
side on decode-shaped products (``rows`` × ``in`` activations times an ``out`` × ``in`` weight).

Kernels (each on the same random weight, N(0, 0.02²)):

- ``fp32``: ``F.linear`` on fp32 (oneDNN / MKL sgemm);
- ``bf16-onednn``: bf16 weight reordered once for oneDNN (``mkldnn._linear_pointwise``, the path of
  :mod:`omniduplex.kernels.cpu_linear`; AMX or AVX512-BF16 where the CPU has them);
- ``int8-wo``: int8 weight per output channel, bf16 activations (``torch._weight_int8pack_mm``, aten's
  weight-only int8 kernel, the one torchao's int8 weight-only mode calls);
- ``int8-dyn``: int8 weight per output channel, activations quantized per call and per tensor
  (``quantized::linear_dynamic`` on the ``x86`` engine: fbgemm's AVX2/AVX512 int8 GEMM; measured, not
  served: Qwen2.5's activation outliers break per-tensor scales, :mod:`omniduplex.kernels.int8_linear`);
- ``q8_0-ours``: GGML Q8_0 blocks on our C++ kernels (:mod:`omniduplex.kernels.quant`), for reference.

Each product is timed on ``copies`` weights used in turn, their int8 bytes together ≥ 96 MB, so that the
weight streams from memory as in a real decode step (one weight alone would sit in the L3 cache and
flatter every kernel). Figure: the best µs of one product over ``reps`` passes (the best, not the median:
on a shared machine the other passes measure the neighbours).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from omniduplex.benchmarks.report import print_table, write_json
from omniduplex.kernels.int8_linear import quantize_per_channel

SHAPES = ((896, 1152), (896, 9728), (4864, 896), (1536, 2048), (1536, 17920), (8960, 1536))
"""(in, out) of the 0.5B's and 1.5B's decode linears (Qwen2.5: merged qkv, merged gate_up, down)."""
KERNELS = ("fp32", "bf16-onednn", "int8-wo", "int8-dyn", "q8_0-ours")


def _kernel(name: str, w: torch.Tensor):
    """``(prepared weight, fn(x fp32 [rows, in], prepared) -> [rows, out])`` for kernel ``name``."""
    if name == "fp32":
        return w, lambda x, p: F.linear(x, p)
    if name == "bf16-onednn":
        return torch.ops.mkldnn._reorder_linear_weight(
            w.bfloat16()
        ), lambda x, p: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), p, None, "none", [], "")
    if name == "int8-wo":
        q, s = quantize_per_channel(w)
        return (q, s.bfloat16()), lambda x, p: torch._weight_int8pack_mm(x.bfloat16(), p[0], p[1])
    if name == "int8-dyn":
        q, s = quantize_per_channel(w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qt = torch.quantize_per_channel(
                w, s.double(), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8
            )
            packed = torch.ops.quantized.linear_prepack(qt, None)
        return packed, lambda x, p: torch.ops.quantized.linear_dynamic(x, p, False)
    if name == "q8_0-ours":
        import gguf
        from gguf.quants import quantize

        from omniduplex.kernels import quant

        blocks = torch.from_numpy(quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0))
        k = w.shape[1]
        return blocks, lambda x, p: quant.qmatmul(x, p, quant.TYPES["Q8_0"], k)
    raise ValueError(f"unknown kernel {name!r}; choose from {', '.join(KERNELS)}")


def _time(name: str, k: int, n: int, rows: tuple[int, ...], reps: int) -> dict[int, float]:
    copies = max(2, -(-96_000_000 // (k * n)))
    gen = torch.Generator().manual_seed(0)
    prepared, fn = zip(*(_kernel(name, torch.randn(n, k, generator=gen) * 0.02) for _ in range(copies)))
    out: dict[int, float] = {}
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, k, generator=gen)
            for p in prepared:  # warm-up (oneDNN builds its kernel per row count)
                fn[0](x, p)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                for p in prepared:
                    fn[0](x, p)
                times.append((time.perf_counter() - t0) / copies)
            out[m] = float(np.min(times)) * 1e6
    return out


def run(
    rows: tuple[int, ...] = (1, 8, 32),
    kernels: tuple[str, ...] = KERNELS,
    shapes: tuple[tuple[int, int], ...] = SHAPES,
    threads: int = 2,
    reps: int = 9,
    json_out: Path | None = None,
) -> dict:
    """Time every kernel on every shape and row count; print one table (µs per product, and each kernel's
    speed against fp32); returns ``{kernel: {"in x out": {rows: µs}}}``."""
    torch.set_num_threads(threads)
    res: dict[str, dict[str, dict[int, float]]] = {}
    for name in kernels:
        try:
            res[name] = {f"{k}x{n}": _time(name, k, n, rows, reps) for k, n in shapes}
        except RuntimeError as e:  # e.g. oneDNN bf16 on a CPU without AVX512-BF16/AVX-NE-CONVERT
            print(f"{name}: not available on this CPU ({str(e).splitlines()[0]})")
            res[name] = {f"{k}x{n}": {m: float("nan") for m in rows} for k, n in shapes}
    print(
        f"\nDecode-shaped linears: µs per product (best of {reps}), {threads} thread(s), "
        f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print_table(
        ["in x out", "rows", *kernels],
        (
            [shape, m, *(f"{res[kn][shape][m]:.0f}" for kn in kernels)]
            for shape in res[kernels[0]]
            for m in rows
        ),
    )
    write_json(res, json_out)
    return res
