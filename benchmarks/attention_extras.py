"""The extra parts of ``bench_attention``: the fused element-wise ops beside their torch code, and a sweep
of the decode kernel's tile / stage / split choices (evidence for retuning
:mod:`omniduplex.kernels.paged_decode_config`). CUDA only; run through
``python3 -m omniduplex.benchmarks.bench_attention [--sweep]``.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

import torch
import torch.nn.functional as F

from omniduplex.benchmarks.attention_workload import (
    DEV,
    DTYPE,
    HKV,
    HQ,
    D,
    bench_ms,
    nbytes,
    paged_case,
)
from omniduplex.kernels import paged_decode_attention as pda
from omniduplex.kernels import triton_ops
from omniduplex.kernels.paged_decode_config import DecodeConfig, choose_num_splits
from omniduplex.models.layers import RMSNorm, RotaryEmbedding, apply_rotary

__all__ = ["SWEEP", "elementwise", "sweep"]
HIDDEN, INTER = 1024, 3072
"""Qwen3-0.6B widths for the element-wise ops."""


def _graph_us(fn) -> float:
    """Median microseconds per call of ``fn`` replayed as a CUDA graph (no L2 flush: tiny ops)."""
    import triton.testing

    return 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))


SWEEP = [DecodeConfig(64, 4, 2), DecodeConfig(64, 4, 3), DecodeConfig(32, 4, 3), DecodeConfig(128, 8, 3)]
"""Configs :func:`sweep` tries (the heuristic picks ``DecodeConfig(64, 4, 3)`` for bf16 x 128 on sm80/90)."""
SWEEP_CASES = ((1, 4096), (8, 4096), (128, 4096))


def sweep(gen: torch.Generator) -> list[dict]:
    """Our kernel's GB/s over :data:`SWEEP` configs and split counts (half, the heuristic's, double) at
    1, 8 and 128 x 4096: evidence for retuning :mod:`omniduplex.kernels.paged_decode_config`."""
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, ctx in SWEEP_CASES:
        case = paged_case(batch, ctx, gen)
        for cfg in SWEEP:
            auto = choose_num_splits(batch, HKV, ctx // cfg.block_n, sms)
            for splits in sorted({max(1, auto // 2), auto, min(64, 2 * auto)}):
                call = partial(pda.paged_decode_attention_triton, *case, D**-0.5, splits, max_seq_len=ctx)
                gbps = nbytes(batch, ctx) / bench_ms(partial(call, config=cfg)) / 1e6
                rows.append(dict(batch=batch, context=ctx, **asdict(cfg), num_splits=splits, GBps=gbps))
                print(f"sweep {batch:>4} x {ctx} {cfg} splits={splits:<3} {gbps:8.0f} GB/s")
        del case
        torch.cuda.empty_cache()
    return rows


def elementwise(tokens: int, gen: torch.Generator) -> list[dict]:
    """Ours beside the torch code of models/layers.py, each replayed as a CUDA graph."""

    def new(*shape):
        return torch.randn(*shape, device=DEV, dtype=DTYPE, generator=gen)

    norm = RMSNorm(HIDDEN).to(DEV, DTYPE)
    head_norm = RMSNorm(D).to(DEV, DTYPE)
    x, delta, gate_up = new(tokens, HIDDEN), new(tokens, HIDDEN), new(tokens, 2 * INTER)
    qkv = new(tokens, (HQ + 2 * HKV) * D)
    q = qkv[:, : HQ * D].view(tokens, HQ, D)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(tokens, HKV, D)
    cos, sin = RotaryEmbedding(D, 1e6).to(DEV)(torch.arange(tokens, device=DEV) + 1000)
    w, hw, eps = norm.weight, head_norm.weight, norm.eps

    def torch_rope():
        return apply_rotary(head_norm(q), cos, sin), apply_rotary(head_norm(k), cos, sin)

    def ours_rope():
        triton_ops.rotary_(q, k, cos, sin, hw, hw, eps)
        return q, k

    def torch_silu():
        g, u = gate_up.chunk(2, dim=-1)
        return F.silu(g) * u

    pairs = [
        ("rms_norm", lambda: triton_ops.rms_norm(x, w, eps), lambda: norm(x)),
        ("add_rms_norm", lambda: triton_ops.add_rms_norm(x, delta, w, eps)[1], lambda: norm(x + delta)),
        ("qk_norm_rope", ours_rope, torch_rope),
        ("silu_and_mul", lambda: triton_ops.silu_and_mul(gate_up), torch_silu),
    ]
    rows = []
    flat = lambda v: torch.cat([t.flatten() for t in v]) if isinstance(v, tuple) else v.flatten()  # noqa: E731
    for name, ours, ref in pairs:
        saved = qkv.clone()
        want = flat(ref()).float()
        got = flat(ours()).float()  # a copy: the in-place rope's result, before its input is restored
        qkv.copy_(saved)
        err = (got - want).abs().max().item()
        ok = err <= 0.02 * want.abs().max().item() + 1e-3  # ~2 bf16 roundings of the largest value
        ours_us, torch_us = _graph_us(ours), _graph_us(ref)
        qkv.copy_(saved)
        speedup = torch_us / ours_us
        rows.append(dict(op=name, tokens=tokens, ours_us=ours_us, torch_us=torch_us, speedup=speedup))
        rows[-1].update(max_abs_err=err, ok=ok)
    return rows
