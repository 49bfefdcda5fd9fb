"""Relay across real processes (multiprocessing spawn): backpressure, crashes, restarts, /dev/shm hygiene."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import uuid

import pytest
import torch

from omniduplex.relay import (
    ConsumerDied,
    EdgeClosed,
    EdgeConfig,
    EdgeConsumer,
    EdgeProducer,
    ProducerDied,
    ipc_address,
    list_segments,
)

pytestmark = pytest.mark.slow

CTX = mp.get_context("spawn")
WAIT_S = 30.0  # upper bound for anything that should happen soon; never reached when things work


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


# ---------------------------------------------------------------- child process bodies

def slow_consumer(name: str, address: str, n: int, delay_s: float, q) -> None:
    """Reads ``n`` messages, sleeping ``delay_s`` after each; reports correctness and its RSS."""
    rss, ok = [], True
    with EdgeConsumer(name, address) as c:
        for i in range(n):
            m = c.recv(WAIT_S)
            ok &= m is not None and m.seq == i and bool((m.tensors["x"] == i).all())
            del m
            rss.append(rss_bytes())
            time.sleep(delay_s)
    q.put({"ok": ok, "rss": rss})


def stalling_consumer(name: str, address: str, n: int, ready) -> None:
    """Reads ``n`` messages, then stops reading (and waits to be killed)."""
    c = EdgeConsumer(name, address)
    for _ in range(n):
        assert c.recv(WAIT_S) is not None
    ready.set()
    time.sleep(3600)


def counting_consumer(name: str, address: str, n: int, sums: list[int], q) -> None:
    """Reads ``n`` messages and checks their order and checksums."""
    bad = 0
    with EdgeConsumer(name, address) as c:
        for i in range(n):
            m = c.recv(WAIT_S)
            if m is None:
                break
            idx = int(m.tensors["i"][0])
            bad += idx != i or int(m.tensors["x"].sum()) != sums[i % len(sums)]
        q.put({"received": i + 1, "bad": bad, "inline": c.stats.inline_messages})


def producer_then_wait(name: str, address: str, n: int, base: int, ready, close: bool) -> None:
    """Sends ``n`` messages valued ``base + i``; then closes cleanly or waits to be killed."""
    p = EdgeProducer(name, address, EdgeConfig(slots=4, slot_bytes=64 << 10))
    for i in range(n):
        p.send(base, {"x": torch.full((8192,), float(base + i))}, seq=i, last=i == n - 1)
    ready.set()
    if close:
        p.close()
    else:
        time.sleep(3600)


def spawn(target, *args) -> mp.Process:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def kill(proc: mp.Process) -> None:
    os.kill(proc.pid, signal.SIGKILL)


def edge() -> tuple[str, str]:
    name = f"p-{uuid.uuid4().hex[:10]}"
    return name, ipc_address(name)


# ---------------------------------------------------------------- tests

def test_slow_consumer_throttles_the_producer_and_memory_stays_flat():
    name, address = edge()
    n, numel = 60, 256 * 1024  # 60 messages of 1 MiB through 4 slots of 256 KiB
    q = CTX.Queue()
    proc = spawn(slow_consumer, name, address, n, 0.01, q)
    cfg = EdgeConfig(slots=4, slot_bytes=256 << 10, send_timeout_s=WAIT_S)
    with EdgeProducer(name, address, cfg) as p:
        rss_start = None
        for i in range(n):
            p.send(1, {"x": torch.full((numel,), float(i))}, seq=i, last=i == n - 1)
            if i == 5:
                rss_start = rss_bytes()
        rss_growth = rss_bytes() - rss_start
        result = q.get(timeout=WAIT_S)
        proc.join(WAIT_S)
        assert p.stats.credit_waits > n // 2  # the producer really was held back
        assert p.stats.max_inflight_slots <= 4
    assert result["ok"]
    # 60 MiB went through; neither end grew by more than a few slots' worth
    assert rss_growth < 16 << 20
    consumer_growth = max(result["rss"][5:]) - result["rss"][5]
    assert consumer_growth < 16 << 20, consumer_growth


def test_consumer_killed_mid_stream_raises_then_a_restarted_consumer_reattaches():
    name, address = edge()
    ready = CTX.Event()
    cfg = EdgeConfig(slots=3, slot_bytes=16 << 10, send_timeout_s=WAIT_S)
    with EdgeProducer(name, address, cfg) as p:
        victim = spawn(stalling_consumer, name, address, 5, ready)
        sent = 0
        with pytest.raises(ConsumerDied):
            while True:  # blocks on credits once the consumer stalls; the kill must surface as an error
                p.send(1, {"x": torch.zeros(4096)}, seq=sent)
                sent += 1
                if sent == 5:
                    assert ready.wait(WAIT_S)
                    threading.Timer(0.2, kill, (victim,)).start()
        assert sent == 5 + 3 and p.free_slots == 3  # it filled the 3 slots, then got them back
        victim.join(WAIT_S)

        q = CTX.Queue()
        sums = [0]
        restarted = spawn(counting_consumer, name, address, 20, sums, q)
        for i in range(20):
            p.send(2, {"x": torch.zeros(4096, dtype=torch.uint8), "i": torch.tensor([i])}, seq=i)
        result = q.get(timeout=WAIT_S)
        restarted.join(WAIT_S)
        assert result == {"received": 20, "bad": 0, "inline": 0}
        assert p.stats.attaches == 2
    assert not any(name in s for s in list_segments())


def test_producer_killed_consumer_gets_an_error_no_shm_leak_and_a_restarted_producer_reattaches():
    name, address = edge()
    c = EdgeConsumer(name, address)
    try:
        ready = CTX.Event()
        victim = spawn(producer_then_wait, name, address, 3, 100, ready, False)
        got = [c.recv(WAIT_S) for _ in range(3)]
        assert [float(m.tensors["x"][0]) for m in got] == [100.0, 101.0, 102.0]
        assert ready.wait(WAIT_S)
        assert len(list_segments(victim.pid)) == 1
        kill(victim)
        with pytest.raises(ProducerDied):
            c.recv(WAIT_S)
        assert list_segments(victim.pid) == []  # the consumer's janitor unlinked the orphan

        ready2 = CTX.Event()
        restarted = spawn(producer_then_wait, name, address, 3, 200, ready2, True)
        got = [c.recv(WAIT_S) for _ in range(3)]
        assert [float(m.tensors["x"][0]) for m in got] == [200.0, 201.0, 202.0]
        with pytest.raises(EdgeClosed):
            c.recv(WAIT_S)
        restarted.join(WAIT_S)
        assert list_segments(restarted.pid) == []
        victim.join(WAIT_S)
    finally:
        c.close()


def test_ten_thousand_messages_leave_no_segment_behind():
    name, address = edge()
    n = 10_000
    g = torch.Generator().manual_seed(0)
    payloads = [torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
                for size in (16, 100, 1000, 5000, 20000)]
    sums = [int(x.sum()) for x in payloads]
    q = CTX.Queue()
    proc = spawn(counting_consumer, name, address, n, sums, q)
    cfg = EdgeConfig(slots=8, slot_bytes=4096, inline_bytes=256, send_timeout_s=WAIT_S)
    with EdgeProducer(name, address, cfg) as p:
        for i in range(n):
            p.send(i, {"x": payloads[i % len(payloads)], "i": torch.tensor([i])}, last=True)
            if i % 2500 == 0:  # one pre-allocated segment, never more
                assert len([s for s in list_segments(os.getpid()) if name in s]) == 1
        result = q.get(timeout=WAIT_S)
        proc.join(WAIT_S)
    assert result["received"] == n and result["bad"] == 0
    assert result["inline"] == 2 * n // 5  # the 16 B and 100 B payloads rode inline
    assert not any(name in s for s in list_segments())
