"""Paged decode attention: time per call of the torch path (CPU) and the Triton kernel (CUDA, if present).

Prints one row per (backend, dtype, batch, context): median milliseconds per call over ``--iters`` calls
after warm-up, and the K/V bytes read per second it implies. Also times one mixed step (decodes plus a
64-token prefill chunk) per context on the torch path. No assertions; numbers only.

On a shared machine use ``--threads 1``: with every core busy, OpenMP barriers of a 2-thread run stall
for a scheduler tick (~24 ms per call seen here).

    python benchmarks/bench_attention.py [--heads 16 --kv-heads 4 --head-dim 128 --iters 30 --threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch

from omniduplex.kernels import HAS_TRITON, paged_attention_torch, paged_decode_attention_triton

BLOCK = 16
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_batch(batch, context, q_lens, heads, kv_heads, head_dim, dtype, device):
    """Random paged batch, blocks shuffled; ``q_lens[s]`` queries at the end of each ``context`` sequence."""
    blocks = -(-context // BLOCK)
    num_blocks = batch * blocks
    k_cache = torch.randn(num_blocks, BLOCK, kv_heads, head_dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    block_tables = torch.randperm(num_blocks, device=device).view(batch, blocks).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device=device)
    query_start_loc = torch.tensor([0, *q_lens], device=device).cumsum(0).to(torch.int32)
    return q, k_cache, v_cache, block_tables, seq_lens, query_start_loc


def median_ms(fn, iters, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    h, hkv, d = args.heads, args.kv_heads, args.head_dim
    scale = d**-0.5

    backends = [("torch", torch.device("cpu"))]
    if HAS_TRITON and torch.cuda.is_available():
        backends.append(("triton", torch.device("cuda")))
    print(
        f"heads={h} kv_heads={hkv} head_dim={d} block={BLOCK} torch={torch.__version__} "
        f"threads={torch.get_num_threads()}"
    )
    print(
        f"{'backend':<8} {'dtype':<5} {'batch':>5} {'context':>7} {'q/seq':>6} {'ms/call':>9} {'KV GB/s':>8}"
    )
    for name, device in backends:
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            for context in args.contexts:
                for batch in args.batches:
                    q, kc, vc, bt, sl, qsl = make_batch(batch, context, [1] * batch, h, hkv, d, dtype, device)
                    if name == "torch":
                        fn = partial(paged_attention_torch, q, kc, vc, bt, sl, qsl, scale, context, 1)
                    else:
                        fn = partial(paged_decode_attention_triton, q, kc, vc, bt, sl, scale)
                    ms = median_ms(fn, args.iters, device)
                    kv_bytes = 2 * batch * context * hkv * d * kc.element_size()
                    gbps = kv_bytes / ms / 1e6
                    print(f"{name:<8} {dtype_name:<5} {batch:>5} {context:>7} {1:>6} {ms:>9.3f} {gbps:>8.2f}")
                if name == "torch":  # one chunked-prefill step: decodes plus a 64-token chunk
                    batch = max(args.batches)
                    q_lens = [1] * (batch - 1) + [64]
                    q, kc, vc, bt, sl, qsl = make_batch(batch, context, q_lens, h, hkv, d, dtype, device)
                    ms = median_ms(
                        partial(paged_attention_torch, q, kc, vc, bt, sl, qsl, scale, context),
                        args.iters,
                        device,
                    )
                    print(f"{name:<8} {dtype_name:<5} {batch:>5} {context:>7} {'mixed':>6} {ms:>9.3f}")


if __name__ == "__main__":
    main()
