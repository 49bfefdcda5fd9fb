"""``omniduplex bench relay``: relay shared-memory slots vs pickle over ZMQ vs ``multiprocessing.Queue``.

Per tensor size (default 4 KiB, 1 MiB, 64 MiB) and method (see :mod:`.bench_methods`):

- **GB/s**: ``n`` distinct tensors sent back to back; bytes / (last receive − first send).
- **p50/p99 latency (ms)**: one message in flight at a time (the receiver acks each); one-way time
  from before ``send`` to after the receiver holds the tensor (CLOCK_MONOTONIC on both sides).
- **signal latency (µs)**: the same, for an 8-byte tensor through the relay (it rides inline in
  the control message).
- **memory under a slow consumer**: a new 1 MiB tensor produced every 2 ms (or as fast as the
  method allows), consumed every 20 ms (10× slower); the extra memory (PSS of both processes +
  the host's ``Shmem``, minus the baseline after warm-up; the relay's pool is committed before
  the baseline) after each quarter of the sends, and its peak (sampled every 20 ms). ``Shmem`` is
  host-wide: other processes creating shared memory meanwhile would show up as noise.

Every tensor is distinct (``mp.Queue`` moves a sent tensor into shared memory in place, so
re-sending one would cost nothing). Run: ``python -m omniduplex.benchmarks.relay --json out.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import pickle
import threading
import time

import numpy as np
import torch
import zmq

from omniduplex.benchmarks.relay_methods import METHODS, Sender, bench_ipc, receiver_main, unlink_ipc
from omniduplex.relay.edge import EdgeConfig

SIZES = (4 << 10, 1 << 20, 64 << 20)
MEMORY_METHODS = ("relay-shm", "pickle-zmq", "mp-queue")
BENCH_EDGE = EdgeConfig(slots=8, slot_bytes=8 << 20, send_timeout_s=60.0)  # 64 MiB pool
MEMORY_EDGE = EdgeConfig(slots=4, slot_bytes=1 << 20, send_timeout_s=60.0)  # 4 MiB pool


def _iters(size: int, quick: bool) -> tuple[int, int, int]:
    """(warm-up, stream, ping-pong) message counts for ``size`` bytes."""
    if size <= 64 << 10:
        n = (1000, 500) if not quick else (100, 50)
        return 20, *n
    if size <= 8 << 20:
        return (4, 200, 100) if not quick else (2, 20, 10)
    return (1, 4, 4) if not quick else (1, 2, 2)


def _tensors(size: int, n: int) -> list[torch.Tensor]:
    numel = max(1, size // 4)
    return [torch.full((numel,), float(i)) for i in range(n)]


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


class _Run:
    """One receiver child plus the ack socket it reports on."""

    def __init__(self, method: str, config: EdgeConfig, phases: list[tuple[str, int, float]]) -> None:
        ctx = mp.get_context("spawn")
        self.ack = zmq.Context.instance().socket(zmq.PULL)
        self.ack_address = ack_address = bench_ipc("ack")
        self.ack.bind(ack_address)
        self.sender = Sender(method, ctx, config)
        self.proc = ctx.Process(target=receiver_main, daemon=True,
                                args=(method, self.sender.address, self.sender.queue, ack_address, phases))
        self.proc.start()

    def stamps(self) -> list[int]:
        if not self.ack.poll(120_000):
            raise TimeoutError("bench receiver reported nothing for 120 s")
        return pickle.loads(self.ack.recv())

    def stream(self, tensors: list[torch.Tensor]) -> float:
        """Send back to back; return GB/s."""
        t0 = time.perf_counter_ns()
        for t in tensors:
            self.sender.send(t)
        last = self.stamps()[-1]
        return sum(t.nbytes for t in tensors) / (last - t0)

    def pingpong(self, tensors: list[torch.Tensor]) -> list[float]:
        """One in flight at a time; return one-way latencies in seconds."""
        sent = []
        for t in tensors:
            sent.append(time.perf_counter_ns())
            self.sender.send(t)
            self.ack.recv()
        return [(r - s) * 1e-9 for r, s in zip(self.stamps(), sent, strict=True)]

    def close(self) -> None:
        self.proc.join(60)
        self.sender.close()
        self.ack.close(linger=0)
        unlink_ipc(self.ack_address)


def bench_method(method: str, sizes: tuple[int, ...], quick: bool,
                 signal: bool) -> tuple[list[dict], dict | None]:
    """Throughput and latency rows of ``method`` for each size; signal latency if ``signal``."""
    phases: list[tuple[str, int, float]] = []
    for size in sizes:
        warm, n_stream, n_ping = _iters(size, quick)
        phases += [("stream", warm, 0.0), ("stream", n_stream, 0.0), ("pingpong", n_ping, 0.0)]
    n_signal = 200 if quick else 2000
    if signal:
        phases += [("pingpong", 50, 0.0), ("pingpong", n_signal, 0.0)]
    run = _Run(method, BENCH_EDGE, phases)
    rows, sig = [], None
    try:
        for size in sizes:
            warm, n_stream, n_ping = _iters(size, quick)
            run.stream(_tensors(size, warm))
            gbps = run.stream(_tensors(size, n_stream))
            lat = run.pingpong(_tensors(size, n_ping))
            rows.append({"method": method, "size": size, "gbps": gbps, "p50_ms": _pct(lat, 50) * 1e3,
                         "p99_ms": _pct(lat, 99) * 1e3, "n_stream": n_stream, "n_pingpong": n_ping})
        if signal:
            run.pingpong([torch.tensor([i]) for i in range(50)])
            lat = run.pingpong([torch.tensor([i]) for i in range(n_signal)])
            sig = {"method": method, "bytes": 8, "p50_us": _pct(lat, 50) * 1e6, "p99_us": _pct(lat, 99) * 1e6,
                   "n": n_signal}
    finally:
        run.close()
    return rows, sig


def _pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _shmem() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def bench_memory(method: str, n: int, period_s: float = 0.002, slowdown: int = 10) -> dict:
    """Extra memory (bytes) while a consumer ``slowdown``× slower than the producer drains ``n`` MiB."""
    run = _Run(method, MEMORY_EDGE, [("stream", 2, 0.0), ("slow", n, period_s * slowdown)])
    samples: list[int] = []
    stop = threading.Event()
    try:
        run.stream(_tensors(1 << 20, 2))
        pids = (mp.current_process().pid, run.proc.pid)

        def total() -> int:
            return sum(_pss(p) for p in pids) + _shmem()

        base = total()

        def sample() -> None:
            while not stop.wait(0.02):
                samples.append(total() - base)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        quarters = []
        for i in range(n):
            run.sender.send(torch.full((1 << 18,), float(i)))  # producing a new 1 MiB tensor
            time.sleep(period_s)
            if (i + 1) % max(1, n // 4) == 0:
                quarters.append((total() - base) / 2**20)
        produced_s = time.perf_counter() - t0
        run.stamps()
        consumed_s = time.perf_counter() - t0
        stop.set()
        sampler.join()
    finally:
        stop.set()
        run.close()
    return {"method": method, "messages": n, "bytes_each": 1 << 20,
            "peak_extra_mb": max(samples + [0]) / 2**20, "extra_mb_by_quarter_of_sends": quarters[:4],
            "producer_s": produced_s, "consumer_s": consumed_s}


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def render(result: dict) -> str:
    """Markdown tables of a :func:`run` result."""
    pickle_gbps = {r["size"]: r["gbps"] for r in result["throughput"] if r["method"] == "pickle-zmq"}
    lines = ["| size | method | GB/s | × pickle-zmq | p50 ms | p99 ms |", "|---|---|---:|---:|---:|---:|"]
    for r in result["throughput"]:
        ratio = r["gbps"] / pickle_gbps[r["size"]] if r["size"] in pickle_gbps else float("nan")
        lines.append(f"| {_size(r['size'])} | {r['method']} | {r['gbps']:.3f} | {ratio:.1f} | "
                     f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} |")
    if result.get("signal"):
        s = result["signal"]
        lines += ["", "| control signal (relay, 8 B inline, one-way) | p50 µs | p99 µs |", "|---|---:|---:|",
                  f"| {s['method']} | {s['p50_us']:.1f} | {s['p99_us']:.1f} |"]
    if result.get("memory"):
        lines += ["", "| slow consumer (10×), 1 MiB msgs | messages | extra MB after 25/50/75/100 % of sends "
                  "| peak extra MB | producer s | consumer s |", "|---|---:|---|---:|---:|---:|"]
        for m in result["memory"]:
            q = " / ".join(f"{x:.0f}" for x in m["extra_mb_by_quarter_of_sends"])
            lines.append(f"| {m['method']} | {m['messages']} | {q} | {m['peak_extra_mb']:.1f} | "
                         f"{m['producer_s']:.2f} | {m['consumer_s']:.2f} |")
    return "\n".join(lines)


def run(sizes: tuple[int, ...] = SIZES, methods: tuple[str, ...] = METHODS, quick: bool = False,
        memory: bool = True, json_path: str | None = None, echo: bool = True) -> dict:
    """Run the benchmark, print a markdown table (if ``echo``), return (and optionally save) the results.

    ``sizes`` in bytes; ``quick`` cuts the iteration counts ~10× (a smoke run, not a measurement).
    """
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    result: dict = {"sizes": list(sizes), "throughput": [], "signal": None, "memory": [],
                    "edge": {"slots": BENCH_EDGE.slots, "slot_bytes": BENCH_EDGE.slot_bytes},
                    "memory_edge": {"slots": MEMORY_EDGE.slots, "slot_bytes": MEMORY_EDGE.slot_bytes}}
    if memory:  # first, while this process holds nothing from the other runs
        for method in MEMORY_METHODS:
            if method in methods:
                gc.collect()
                result["memory"].append(bench_memory(method, 30 if quick else 150))
    for method in methods:
        msizes = tuple(s for s in sizes if method != "relay-shm-slots" or s <= BENCH_EDGE.inline_bytes)
        if not msizes:
            continue
        rows, sig = bench_method(method, msizes, quick, signal=method == "relay-shm")
        result["throughput"] += rows
        result["signal"] = result["signal"] or sig
    if echo:
        print(render(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return result


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m omniduplex.benchmarks.relay [--sizes ...] [--methods ...] [--quick] [--json F]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="tensor sizes in bytes, a,b,c")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    ap.add_argument("--quick", action="store_true", help="~10x fewer iterations (smoke run)")
    ap.add_argument("--no-memory", action="store_true", help="skip the slow-consumer memory run")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    run(tuple(int(s) for s in args.sizes.split(",")), tuple(args.methods.split(",")), quick=args.quick,
        memory=not args.no_memory, json_path=args.json)


if __name__ == "__main__":
    main()
