"""Paged decode attention on CUDA: our Triton kernel beside cuDNN SDPA, and the fused element-wise ops
beside their torch code.

    python3 -m omniduplex.benchmarks.bench_attention [--json PATH] [--sweep] [--batches 1 8 ...]

Workload (issue 33): bf16, 16 query / 8 KV heads x 128, KV block 16, every sequence ``context`` tokens long.
Ours reads a paged cache through a shuffled block table; SDPA (cuDNN, else flash / efficient / math, the
backend used is reported) reads the same values as contiguous ``[batch, 8, context, 128]`` K/V. Times are
the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call, GPU time only); GB/s
count the bytes of K and V read plus q and the output written, the same formula for both. ``ours_graph``
is our call captured in a CUDA graph and replayed (checked equal to the eager call, also after the
lengths and block table change in place); ``eager_us`` is the wall time per back-to-back eager call (host
launch cost included). Targets (issue 33): ours >= 50% of SDPA's GB/s at batch >= 8, >= 2,000 GB/s at
128 x 4096, >= 40% at batch 1. The element-wise ops (Qwen3-0.6B widths) are timed as CUDA graphs
(``do_bench_cudagraph``), ours beside the torch code of models/layers.py.

Prints a table and writes JSON (``--json``): ``device``, ``capability``, ``torch``, ``triton``, ``shape``,
``cases`` (per case: ``batch``, ``context``, ``num_splits``, ``block_n``, ``ours_ms``, ``ours_GBps``,
``ours_graph_GBps``, ``eager_us``, ``sdpa_backend``, ``sdpa_ms``, ``sdpa_GBps``, ``ratio``, ``max_abs_err``,
``graph_ok``), ``targets`` (``name``, ``value``, ``threshold``, ``status`` met / missed / not measured),
``elementwise`` (``op``, ``tokens``, ``ours_us``, ``torch_us``, ``speedup``, ``max_abs_err``, ``ok``),
``sweep`` (with ``--sweep``: ``batch``, ``context``, ``block_n``, ``num_warps``, ``num_stages``,
``num_splits``, ``GBps``; else empty), ``errors`` (a part that raised: the others still run), ``ok`` (no
error and every correctness check passed). The JSON is rewritten after each part. Exit status 1 when a
check fails, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from functools import partial

import torch
import torch.nn.functional as F

from omniduplex.kernels import paged_decode_attention as pda
from omniduplex.kernels import triton_ops
from omniduplex.kernels.paged_decode_config import DecodeConfig, choose_config, choose_num_splits
from omniduplex.models.layers import RMSNorm, RotaryEmbedding, apply_rotary

HQ, HKV, D, BLOCK = 16, 8, 128, 16
DTYPE = torch.bfloat16
HIDDEN, INTER = 1024, 3072
DEV = "cuda"
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def _fail_without_cuda() -> str | None:
    """The one-line reason this benchmark cannot run here, or None."""
    if not torch.cuda.is_available():
        return f"bench_attention needs CUDA: torch {torch.__version__} sees no GPU"
    if not pda.HAS_TRITON:
        return "bench_attention needs CUDA and triton: triton is not installed"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "bench_attention needs CUDA: TRITON_INTERPRET=1 would interpret the kernels; unset it"
    return None


def _bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def _graph_us(fn) -> float:
    """Median microseconds per call of ``fn`` replayed as a CUDA graph (no L2 flush: tiny ops)."""
    import triton.testing

    return 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))


def _sdpa(q, k, v, scale):
    """``(fn, backend name)`` of the first SDPA backend that runs this GQA decode shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name in BACKENDS:
        for gqa in (True, False):

            def fn(name=name, gqa=gqa):
                with sdpa_kernel(getattr(SDPBackend, name)):
                    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)

            try:
                fn()
                torch.cuda.synchronize()
                return fn, name + ("" if gqa else " (no enable_gqa)")
            except RuntimeError:
                continue
    raise RuntimeError("no SDPA backend runs this shape")


def _graph_check(q, kc, vc, bt, sl, ctx, scale, gen) -> tuple[bool, object]:
    """Capture our call, replay it, change lengths and block table in place, replay again: equal to eager."""
    call = lambda: pda.paged_decode_attention_triton(q, kc, vc, bt, sl, scale, max_seq_len=ctx)  # noqa: E731
    call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    ok = torch.equal(out, call())
    saved_sl, saved_bt = sl.clone(), bt.clone()
    sl.copy_(torch.randint(0, ctx + 1, sl.shape, device=sl.device, generator=gen, dtype=torch.int32))
    bt.copy_(bt[torch.randperm(bt.shape[0], device=bt.device, generator=gen)])
    graph.replay()
    ok = ok and torch.equal(out, call())
    sl.copy_(saved_sl)
    bt.copy_(saved_bt)
    return ok, graph


def _paged(batch: int, ctx: int, gen: torch.Generator):
    """``(q, k_cache, v_cache, block_tables, seq_lens)``: ``batch`` sequences of ``ctx`` tokens over blocks
    handed out in a random permutation."""
    blocks = ctx // BLOCK
    kc = torch.randn(batch * blocks, BLOCK, HKV, D, device=DEV, dtype=DTYPE, generator=gen)
    vc = torch.randn(batch * blocks, BLOCK, HKV, D, device=DEV, dtype=DTYPE, generator=gen)
    bt = torch.randperm(batch * blocks, device=DEV, generator=gen).view(batch, blocks).to(torch.int32)
    sl = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DTYPE, generator=gen)
    return q, kc, vc, bt, sl


def _nbytes(batch: int, ctx: int) -> int:
    """K and V read plus q and the output written, bf16."""
    return (2 * batch * ctx * HKV * D + 2 * batch * HQ * D) * DTYPE.itemsize


def attention_case(batch: int, ctx: int, gen: torch.Generator) -> dict:
    q, kc, vc, bt, sl = _paged(batch, ctx, gen)
    scale = D**-0.5
    # the same values as contiguous [B, Hkv, ctx, D] for SDPA
    k_sd = kc[bt.long()].reshape(batch, ctx, HKV, D).transpose(1, 2).contiguous()
    v_sd = vc[bt.long()].reshape(batch, ctx, HKV, D).transpose(1, 2).contiguous()
    q_sd = q[:, :, None, :]
    ours = lambda: pda.paged_decode_attention_triton(q, kc, vc, bt, sl, scale, max_seq_len=ctx)  # noqa: E731
    sdpa, backend = _sdpa(q_sd, k_sd, v_sd, scale)
    err = (ours().float() - sdpa()[:, :, 0].float()).abs().max().item()
    graph_ok, graph = _graph_check(q, kc, vc, bt, sl, ctx, scale, gen)
    ours_ms, sdpa_ms, graph_ms = _bench_ms(ours), _bench_ms(sdpa), _bench_ms(graph.replay)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        ours()
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - start) / 50 * 1e6
    nbytes = _nbytes(batch, ctx)
    cfg = choose_config(D, HQ // HKV, DTYPE, torch.cuda.get_device_capability())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return dict(
        batch=batch,
        context=ctx,
        num_splits=choose_num_splits(batch, HKV, -(-ctx // cfg.block_n), sms),
        block_n=cfg.block_n,
        ours_ms=ours_ms,
        ours_GBps=nbytes / ours_ms / 1e6,
        ours_graph_GBps=nbytes / graph_ms / 1e6,
        eager_us=eager_us,
        sdpa_backend=backend,
        sdpa_ms=sdpa_ms,
        sdpa_GBps=nbytes / sdpa_ms / 1e6,
        ratio=sdpa_ms / ours_ms,
        max_abs_err=err,
        graph_ok=graph_ok,
    )


SWEEP = [DecodeConfig(64, 4, 2), DecodeConfig(64, 4, 3), DecodeConfig(32, 4, 3), DecodeConfig(128, 8, 3)]
"""Configs :func:`sweep` tries (the heuristic picks ``DecodeConfig(64, 4, 3)`` for bf16 x 128 on sm80/90)."""
SWEEP_CASES = ((1, 4096), (8, 4096), (128, 4096))


def sweep(gen: torch.Generator) -> list[dict]:
    """Our kernel's GB/s over :data:`SWEEP` configs and split counts (half, the heuristic's, double) at
    1, 8 and 128 x 4096: evidence for retuning :mod:`omniduplex.kernels.paged_decode_config`."""
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, ctx in SWEEP_CASES:
        case = _paged(batch, ctx, gen)
        for cfg in SWEEP:
            auto = choose_num_splits(batch, HKV, ctx // cfg.block_n, sms)
            for splits in sorted({max(1, auto // 2), auto, min(64, 2 * auto)}):
                call = partial(pda.paged_decode_attention_triton, *case, D**-0.5, splits, max_seq_len=ctx)
                gbps = _nbytes(batch, ctx) / _bench_ms(partial(call, config=cfg)) / 1e6
                rows.append(dict(batch=batch, context=ctx, **asdict(cfg), num_splits=splits, GBps=gbps))
                print(f"sweep {batch:>4} x {ctx} {cfg} splits={splits:<3} {gbps:8.0f} GB/s")
        del case
        torch.cuda.empty_cache()
    return rows


def targets(cases: list[dict]) -> list[dict]:
    """The issue's three kernel targets, from the measured cases (pure)."""

    def worst(rows, key):
        return min((r[key] for r in rows), default=None)

    big = [r for r in cases if r["batch"] >= 8]
    one = [r for r in cases if r["batch"] == 1]
    at = [r for r in cases if (r["batch"], r["context"]) == (128, 4096)]
    rows = [
        ("ours/sdpa GB/s at batch >= 8", worst(big, "ratio"), 0.5),
        ("ours GB/s at 128 x 4096", worst(at, "ours_GBps"), 2000.0),
        ("ours/sdpa GB/s at batch 1", worst(one, "ratio"), 0.4),
    ]
    status = lambda v, t: "not measured" if v is None else ("met" if v >= t else "missed")  # noqa: E731
    return [dict(name=n, value=v, threshold=t, status=status(v, t)) for n, v, t in rows]


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--sweep", action="store_true", help="also time other tile/stage/split choices")
    args = parser.parse_args(argv)
    reason = _fail_without_cuda()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    import triton

    gen = torch.Generator(device=DEV).manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(
        f"{props.name} sm{props.major}{props.minor} {props.multi_processor_count} SMs, "
        f"torch {torch.__version__}, triton {triton.__version__}; bf16, {HQ} q / {HKV} kv heads x {D}, "
        f"block {BLOCK}"
    )
    result = dict(
        device=props.name,
        capability=[props.major, props.minor],
        torch=torch.__version__,
        triton=triton.__version__,
        shape=dict(q_heads=HQ, kv_heads=HKV, head_dim=D, block_size=BLOCK, dtype="bf16"),
        cases=[],
        targets=[],
        elementwise=[],
        sweep=[],
        errors=[],
        ok=False,
    )

    def section(name: str, fn, *fn_args):
        """Run one part; an exception is recorded (and fails ``ok``) and the rest still runs. The JSON is
        rewritten after every part, so a run cut short keeps what it measured."""
        try:
            return fn(*fn_args)
        except Exception as e:  # a device check reports every failure, then goes on
            result["errors"].append(f"{name}: {type(e).__name__}: {e}")
            print(f"ERROR {result['errors'][-1]}")
            return None
        finally:
            torch.cuda.empty_cache()
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=2)

    head = f"{'batch':>5} {'ctx':>5} {'splits':>6} {'ours GB/s':>9} {'graph':>6} {'eager us':>8} "
    print(head + f"{'sdpa GB/s':>9} {'ratio':>5} {'err':>7} graph_ok sdpa backend")
    for ctx in args.contexts:
        for batch in args.batches:
            r = section(f"attention {batch}x{ctx}", attention_case, batch, ctx, gen)
            if r is None:
                continue
            result["cases"].append(r)
            print(
                f"{batch:>5} {ctx:>5} {r['num_splits']:>6} {r['ours_GBps']:>9.0f} "
                f"{r['ours_graph_GBps']:>6.0f} {r['eager_us']:>8.1f} {r['sdpa_GBps']:>9.0f} "
                f"{r['ratio']:>5.2f} {r['max_abs_err']:>7.1e} {r['graph_ok']!s:>8} {r['sdpa_backend']}"
            )
    result["targets"] = targets(result["cases"])
    for t in result["targets"]:
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        print(f"target {t['name']} >= {t['threshold']}: {value} {t['status']}")
    print(f"{'op':<14} {'tokens':>6} {'ours us':>8} {'torch us':>8} {'speedup':>7} {'err':>7} ok")
    for tokens in (1, 128):
        for r in section(f"elementwise {tokens}", elementwise, tokens, gen) or []:
            result["elementwise"].append(r)
            print(
                f"{r['op']:<14} {r['tokens']:>6} {r['ours_us']:>8.2f} {r['torch_us']:>8.2f} "
                f"{r['speedup']:>7.2f} {r['max_abs_err']:>7.1e} {r['ok']}"
            )
    if args.sweep:
        result["sweep"] = section("sweep", sweep, gen) or []
    cases, ew = result["cases"], result["elementwise"]
    result["ok"] = (
        not result["errors"]
        and all(r["graph_ok"] and r["max_abs_err"] < 2e-2 for r in cases)
        and all(r["ok"] for r in ew)
    )
    section("write", lambda: None)
    print("all correctness checks passed" if result["ok"] else "CORRECTNESS CHECK FAILED (see the JSON)")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
