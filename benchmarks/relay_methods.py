"""The transports ``bench.py`` compares, each as a sender (benchmark process) and a receiver (child).

- ``relay-shm``: :class:`EdgeProducer`/:class:`EdgeConsumer` over ``ipc://`` with shared-memory slots
  (payloads up to ``inline_bytes`` ride inline in the control message).
- ``relay-shm-slots``: the same with inlining off, so small payloads also go through a slot.
- ``relay-tcp``: the same over ``tcp://127.0.0.1`` with zero-copy ZMQ frames.
- ``pickle-zmq``: ``pickle.dumps(tensor)`` through a ZMQ PUSH/PULL pair over ``ipc://``.
- ``mp-queue``: ``multiprocessing.Queue.put(tensor)`` (torch's reductions move the tensor into a
  fresh shared-memory segment and pass its fd).

The receiver child runs a list of phases; after each it reports its receive timestamps
(``time.perf_counter_ns``, CLOCK_MONOTONIC: comparable across processes) on an ack socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import tempfile
import time
import uuid

import torch
import zmq

from omniduplex.relay.consumer import EdgeConsumer
from omniduplex.relay.edge import EdgeConfig, ipc_address
from omniduplex.relay.producer import EdgeProducer
from omniduplex.relay.tcp import tcp_address

METHODS = ("relay-shm", "relay-shm-slots", "relay-tcp", "pickle-zmq", "mp-queue")


def bench_ipc(tag: str) -> str:
    """A fresh ``ipc://`` address in the temp dir (remove it with :func:`unlink_ipc`)."""
    return f"ipc://{tempfile.gettempdir()}/omniduplex-bench-{tag}-{uuid.uuid4().hex[:8]}.sock"


def unlink_ipc(address: str) -> None:
    """Remove the socket file of an ``ipc://`` address, if any."""
    if address.startswith("ipc://"):
        with contextlib.suppress(OSError):
            os.unlink(address[len("ipc://"):])


class Sender:
    """Benchmark-side end of one method; ``address``/``queue`` are handed to the receiver child."""

    def __init__(self, method: str, ctx, config: EdgeConfig) -> None:
        self.method = method
        self.queue = None
        self.producer: EdgeProducer | None = None
        self.sock = None
        if method.startswith("relay-"):
            name = f"bench-{uuid.uuid4().hex[:8]}"
            address = tcp_address() if method == "relay-tcp" else ipc_address(name)
            if method == "relay-shm-slots":
                config = dataclasses.replace(config, inline_bytes=0)
            self.producer = EdgeProducer(name, address, config)
            self.address = (name, self.producer.address)
        elif method == "pickle-zmq":
            self.sock = zmq.Context.instance().socket(zmq.PUSH)
            self.address = ("", bench_ipc("pickle"))
            self.sock.bind(self.address[1])
        elif method == "mp-queue":
            self.queue = ctx.Queue()
            self.address = ("", "")
        else:
            raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
        self._i = 0

    def send(self, t: torch.Tensor) -> None:
        """Hand one tensor to the transport."""
        self._i += 1
        if self.producer is not None:
            self.producer.send(self._i, {"x": t}, timeout_s=60.0)
        elif self.sock is not None:
            self.sock.send(pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL))
        else:
            self.queue.put(t)

    def close(self) -> None:
        """Release the transport."""
        if self.producer is not None:
            self.producer.close()
        if self.sock is not None:
            self.sock.close(linger=0)
            unlink_ipc(self.address[1])


class Receiver:
    """Child-side end of one method."""

    def __init__(self, method: str, address: tuple[str, str], queue) -> None:
        self.method = method
        self.consumer = None
        self.sock = None
        self.queue = queue
        if method.startswith("relay-"):
            self.consumer = EdgeConsumer(address[0], address[1])
        elif method == "pickle-zmq":
            self.sock = zmq.Context.instance().socket(zmq.PULL)
            self.sock.connect(address[1])

    def recv(self) -> torch.Tensor:
        """The next tensor, materialised in this process."""
        if self.consumer is not None:
            m = self.consumer.recv(60.0)
            if m is None:
                raise TimeoutError("bench receiver got nothing for 60 s")
            return m.tensors["x"]
        if self.sock is not None:
            return pickle.loads(self.sock.recv())
        return self.queue.get(timeout=60.0)

    def close(self) -> None:
        """Release the transport."""
        if self.consumer is not None:
            self.consumer.close()
        if self.sock is not None:
            self.sock.close(linger=0)


def receiver_main(method: str, address: tuple[str, str], queue, ack_address: str,
                  phases: list[tuple[str, int, float]]) -> None:
    """Child process body. Phases: ``("stream", n, 0)`` receive ``n`` back to back;
    ``("pingpong", n, 0)`` ack each message; ``("slow", n, delay_s)`` sleep ``delay_s`` after each.
    After each phase, push the list of receive timestamps (ns) on the ack socket."""
    torch.set_num_threads(1)
    ack = zmq.Context.instance().socket(zmq.PUSH)
    ack.connect(ack_address)
    rx = Receiver(method, address, queue)
    try:
        for kind, n, delay_s in phases:
            stamps = []
            for _ in range(n):
                x = rx.recv()
                stamps.append(time.perf_counter_ns())
                del x
                if kind == "pingpong":
                    ack.send(b"")
                elif kind == "slow":
                    time.sleep(delay_s)
            ack.send(pickle.dumps(stamps))
    finally:
        rx.close()
        ack.close(linger=1000)
