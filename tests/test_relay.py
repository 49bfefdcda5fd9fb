"""Relay in one process: producer in the test thread, consumer in a helper thread (real ZMQ + shm)."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omniduplex.relay import (
    AttachTimeout,
    BackpressureTimeout,
    EdgeClosed,
    EdgeConfig,
    EdgeConsumer,
    EdgeProducer,
    ProtocolError,
    RelayError,
    cuda_ipc_available,
    ipc_address,
    list_segments,
    sweep_orphans,
    tcp_address,
)
from omniduplex.relay.layout import DTYPES, TensorSpec, byte_view
from omniduplex.relay.messages import Abort, Bye, Credit, DataReady, Hello, Ping, Welcome, decode, encode
from omniduplex.relay.shm_pool import SHM_DIR, ShmSlotPool

WAIT_S = 20.0  # generous upper bound for anything that should happen "soon"


def edge_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def address_for(transport: str, name: str) -> str:
    return ipc_address(name) if transport == "ipc" else tcp_address()


class Collector(threading.Thread):
    """Consumer thread: receives ``count`` messages (or until ``stop``), records them or the error."""

    def __init__(self, name: str, address: str, count: int, gate: threading.Event | None = None,
                 after: int = 0) -> None:
        super().__init__(daemon=True)
        self.edge, self.address, self.count = name, address, count
        self.gate, self.after = gate, after  # stop reading after `after` messages until `gate` is set
        self.got: list = []
        self.error: BaseException | None = None
        self.consumer: EdgeConsumer | None = None
        self.paused = threading.Event()

    def run(self) -> None:
        try:
            with EdgeConsumer(self.edge, self.address) as c:
                self.consumer = c
                if self.gate is not None:
                    c.wait_attached(WAIT_S)
                while len(self.got) < self.count:
                    if self.gate is not None and len(self.got) == self.after and not self.gate.is_set():
                        self.paused.set()
                        self.gate.wait(WAIT_S)
                    m = c.recv(timeout_s=WAIT_S)
                    if m is None:
                        raise TimeoutError("collector got nothing")
                    self.got.append(m)
        except BaseException as e:  # reported by finish()
            self.error = e

    def finish(self) -> list:
        self.join(WAIT_S)
        assert not self.is_alive(), "consumer thread hung"
        if self.error is not None:
            raise self.error
        return self.got


def random_tensor(spec: TensorSpec, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if spec.dtype == torch.bool:
        return torch.randint(0, 2, spec.shape, generator=g).bool()
    raw = torch.randint(0, 256, (spec.nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(spec.dtype).reshape(spec.shape)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(byte_view(a), byte_view(b))


# ---------------------------------------------------------------- control messages

spec_st = st.builds(TensorSpec, name=st.text(max_size=12), dtype=st.sampled_from(DTYPES),
                    shape=st.lists(st.integers(0, 2**32 - 1), max_size=4).map(tuple))


@given(epoch=st.integers(0, 2**32 - 1), rid=st.integers(0, 2**64 - 1), seq=st.integers(0, 2**32 - 1),
       off=st.integers(0, 2**64 - 1), nbytes=st.integers(0, 2**64 - 1),
       slots=st.lists(st.integers(0, 0xFFFF), max_size=8).map(tuple),
       specs=st.lists(spec_st, max_size=4).map(tuple),
       flags=st.tuples(st.booleans(), st.booleans(), st.booleans()), payload=st.binary(max_size=64))
def test_data_ready_roundtrip(epoch, rid, seq, off, nbytes, slots, specs, flags, payload):
    inline = flags[1]
    msg = DataReady(epoch=epoch, request_id=rid, seq=seq, frag_offset=0 if inline else off,
                    frag_bytes=len(payload) if inline else nbytes, slots=() if inline else slots,
                    specs=specs if inline or off == 0 else (), last=flags[0], inline=inline, more=flags[2],
                    payload=payload if inline else b"")
    assert decode(encode(msg)) == msg


def test_other_messages_roundtrip_and_signal_is_a_few_dozen_bytes():
    msgs = [Hello("thinker->talker", 1234, "host"), Credit(7, (1, 2, 3), 5), Abort(7, 99), Ping(7),
            Bye(7, "closing"), Welcome(7, "e", "shm", 8, 1 << 20, 64, 42, "host", b"omniduplex-42-e-ab")]
    for m in msgs:
        assert decode(encode(m)) == m
    hidden = DataReady(epoch=1, request_id=5, seq=3, frag_offset=0, frag_bytes=8192, slots=(2,),
                       specs=(TensorSpec("hidden", torch.bfloat16, (1, 4096)),))
    assert len(encode(hidden)) <= 64
    assert len(encode(Credit(1, (2,)))) <= 16


def test_decode_rejects_garbage():
    with pytest.raises(ProtocolError):
        decode(b"\x03\x00")
    with pytest.raises(ProtocolError):
        decode(bytes([99, 0, 0, 0, 0, 0, 0, 0]))
    full = encode(DataReady(epoch=1, request_id=1, seq=0, frag_offset=0, frag_bytes=4, slots=(0,),
                            specs=(TensorSpec("x", torch.float32, (1,)),)))
    with pytest.raises(ProtocolError):
        decode(full[:-2])


# ---------------------------------------------------------------- integrity and order

chunk_st = st.tuples(
    st.integers(0, 3),  # request id
    st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 24), max_size=3)), max_size=3),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transport=st.sampled_from(["ipc", "tcp"]), slots=st.integers(1, 4),
       slot_bytes=st.sampled_from([64, 100, 4096, 65536]), inline_bytes=st.sampled_from([0, 64, 512]),
       chunks=st.lists(chunk_st, min_size=1, max_size=10), seed=st.integers(0, 2**31))
def test_integrity_and_order_property(transport, slots, slot_bytes, inline_bytes, chunks, seed):
    name = edge_name()
    cfg = EdgeConfig(slots=slots, slot_bytes=slot_bytes, inline_bytes=inline_bytes, send_timeout_s=WAIT_S)
    sent = []
    with EdgeProducer(name, address_for(transport, name), cfg) as p:
        col = Collector(name, p.address, len(chunks))
        col.start()
        seqs: dict[int, int] = {}
        remaining = {rid: sum(1 for r, _ in chunks if r == rid) for rid, _ in chunks}
        for i, (rid, tensors) in enumerate(chunks):
            specs = [TensorSpec(f"t{j}", dt, tuple(shape)) for j, (dt, shape) in enumerate(tensors)]
            payload = {s.name: random_tensor(s, seed + 31 * i + j) for j, s in enumerate(specs)}
            seq = seqs.get(rid, 0)
            seqs[rid] = seq + 1
            remaining[rid] -= 1
            assert p.send(rid, payload, seq=seq, last=remaining[rid] == 0)
            sent.append((rid, seq, remaining[rid] == 0, payload))
        got = col.finish()
    assert [(m.request_id, m.seq, m.last) for m in got] == [s[:3] for s in sent]
    for m, (_, _, _, payload) in zip(got, sent, strict=True):
        assert list(m.tensors) == list(payload)
        for k, v in payload.items():
            assert same_bytes(m.tensors[k], v), k


def test_multi_tensor_message_of_mixed_dtypes():
    name = edge_name()
    payload = {
        "hidden": torch.randn(2, 7, 33, dtype=torch.bfloat16),
        "token_ids": torch.arange(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "spec": torch.randn(5, dtype=torch.complex64),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(60, dtype=torch.int16).reshape(6, 10)[:, ::3],  # not contiguous
    }
    with EdgeProducer(name, ipc_address(name), EdgeConfig(slots=2, slot_bytes=512, inline_bytes=0)) as p:
        col = Collector(name, p.address, 1)
        col.start()
        assert p.send(11, payload, seq=4, last=True)
        (m,) = col.finish()
    assert (m.request_id, m.seq, m.last) == (11, 4, True)
    for k, v in payload.items():
        assert same_bytes(m.tensors[k], v.contiguous()), k
        assert torch.equal(m.tensors[k], v)


def test_tiny_payload_rides_inline_and_takes_no_slot():
    name = edge_name()
    with EdgeProducer(name, ipc_address(name), EdgeConfig(slots=1, slot_bytes=4096, inline_bytes=64)) as p:
        col = Collector(name, p.address, 3)
        col.start()
        p.send(1, {"codes": torch.tensor([1, 2, 3], dtype=torch.int32)})
        p.send(1, {})  # a pure marker
        p.send(1, {"pcm": torch.zeros(1024)}, seq=2, last=True)  # 4 KB: a slot
        got = col.finish()
        assert (p.stats.inline_messages, p.stats.fragments) == (2, 1)
    assert got[0].tensors["codes"].tolist() == [1, 2, 3]
    assert got[1].tensors == {}
    assert got[2].tensors["pcm"].shape == (1024,)


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_payload_larger_than_the_whole_pool_streams_through_it(transport):
    name = edge_name()
    x = torch.randn(256, 1024)  # 1 MiB through 2 slots of 16 KiB
    cfg = EdgeConfig(slots=2, slot_bytes=16 << 10)
    with EdgeProducer(name, address_for(transport, name), cfg) as p:
        col = Collector(name, p.address, 2)
        col.start()
        p.send(1, {"x": x, "y": x[:3]})
        p.send(2, {"x": x[:1]}, last=True)
        got = col.finish()
        assert p.stats.fragments >= 64
        assert p.stats.max_inflight_slots <= 2
    assert torch.equal(got[0].tensors["x"], x) and torch.equal(got[0].tensors["y"], x[:3])
    assert torch.equal(got[1].tensors["x"], x[:1])


def test_large_tensor_outlives_the_edge_and_is_an_ordinary_tensor():
    name = edge_name()
    x = torch.randn(3, 1 << 20).to(torch.bfloat16)  # 6 MiB: received into its own huge-page mapping
    with EdgeProducer(name, ipc_address(name), EdgeConfig(slots=2, slot_bytes=1 << 20)) as p:
        col = Collector(name, p.address, 1)
        col.start()
        p.send(1, {"x": x, "ids": torch.arange(3)}, last=True)
        (m,) = col.finish()
    y = m.tensors["x"]
    assert y.dtype == torch.bfloat16 and y.shape == x.shape and torch.equal(y, x)
    y.add_(1)  # writable, and still valid after both ends closed
    assert torch.equal(y, x + 1)
    assert m.tensors["ids"].tolist() == [0, 1, 2]


# ---------------------------------------------------------------- backpressure, abort, lifecycle

def test_backpressure_times_out_with_a_clear_error_then_recovers():
    name = edge_name()
    gate = threading.Event()
    cfg = EdgeConfig(slots=2, slot_bytes=4096, inline_bytes=0)
    with EdgeProducer(name, ipc_address(name), cfg) as p:
        col = Collector(name, p.address, 4, gate=gate, after=0)
        col.start()
        p.send(1, {"x": torch.zeros(1024)}, seq=0)
        p.send(1, {"x": torch.ones(1024)}, seq=1)
        with pytest.raises(BackpressureTimeout, match=rf"{name}.*2 slots of 4096 B"):
            p.send(1, {"x": torch.ones(1024)}, seq=2, timeout_s=0.3)
        assert p.stats.credit_waits >= 1
        gate.set()  # the consumer catches up and returns the credits
        p.send(1, {"x": torch.full((1024,), 2.0)}, seq=2)
        p.send(1, {"x": torch.full((1024,), 3.0)}, seq=3, last=True)
        got = col.finish()
    assert [m.tensors["x"][0].item() for m in got] == [0.0, 1.0, 2.0, 3.0]


def test_send_without_consumer_times_out():
    name = edge_name()
    with EdgeProducer(name, ipc_address(name)) as p, pytest.raises(AttachTimeout, match=name):
        p.send(1, {"x": torch.zeros(4)}, timeout_s=0.2)


def test_producer_abort_drops_unread_chunks_and_returns_their_credits():
    name = edge_name()
    gate = threading.Event()
    cfg = EdgeConfig(slots=4, slot_bytes=4096, inline_bytes=64)
    with EdgeProducer(name, ipc_address(name), cfg) as p:
        col = Collector(name, p.address, 4, gate=gate, after=1)
        col.start()
        p.send(7, {"x": torch.zeros(8)})  # read before the pause
        assert col.paused.wait(WAIT_S)
        p.send(1, {"x": torch.zeros(1024)}, seq=0)  # slot
        p.send(2, {"x": torch.ones(1024)}, seq=0)  # slot
        p.send(1, {"x": torch.zeros(4)}, seq=1)  # inline
        p.abort(1)
        assert p.send(1, {"x": torch.zeros(4)}, seq=2, last=True) is False
        gate.set()
        p.send(2, {"x": torch.ones(4)}, seq=1, last=True)
        # the two slots of request 1 came back: all four slots can be filled again
        p.send(3, {"x": torch.zeros(4 * 1024)}, last=True)
        got = col.finish()
        assert col.consumer.stats.dropped_chunks == 2
    assert [(m.request_id, m.seq) for m in got] == [(7, 0), (2, 0), (2, 1), (3, 0)]


def test_consumer_abort_stops_the_producer_sending_that_request():
    name = edge_name()
    with EdgeProducer(name, ipc_address(name), EdgeConfig(slots=2, slot_bytes=4096)) as p:
        aborted = threading.Event()
        got = []

        def consume():
            with EdgeConsumer(name, p.address) as c:
                got.append(c.recv(WAIT_S))
                c.abort(got[0].request_id)
                aborted.set()
                while (m := c.recv(WAIT_S)) is not None:
                    got.append(m)
                    if m.request_id == 9:
                        return

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        p.send(5, {"x": torch.zeros(2048)})
        assert aborted.wait(WAIT_S)
        sends = 0
        while p.send(5, {"x": torch.zeros(2048)}, seq=1 + sends):  # True until the Abort has arrived
            sends += 1
            assert sends < 10_000
        p.send(9, {"x": torch.ones(2)}, last=True)
        t.join(WAIT_S)
    assert [m.request_id for m in got] == [5, 9]


def test_consumer_close_is_reported_then_a_new_consumer_reattaches():
    name = edge_name()
    with EdgeProducer(name, ipc_address(name), EdgeConfig(slots=2, slot_bytes=4096)) as p:
        first = Collector(name, p.address, 1)
        first.start()
        p.send(1, {"x": torch.zeros(2048)})
        first.finish()  # closes: Bye
        with pytest.raises(EdgeClosed, match="consumer closed"):
            for i in range(1000):
                p.send(1, {"x": torch.zeros(2048)}, seq=1 + i)
        assert p.free_slots == 2
        second = Collector(name, p.address, 1)
        second.start()
        p.send(2, {"x": torch.ones(2048)}, last=True)
        (m,) = second.finish()
        assert m.request_id == 2 and p.stats.attaches == 2


def test_polling_with_zero_timeout_attaches_and_receives():
    name = edge_name()
    got = []

    def poll_loop():
        with EdgeConsumer(name, ipc_address(name)) as c:
            for _ in range(10_000_000):
                m = c.recv(timeout_s=0)
                if m is not None:
                    got.append(m)
                    return

    t = threading.Thread(target=poll_loop, daemon=True)
    t.start()
    with EdgeProducer(name, ipc_address(name)) as p:
        p.send(3, {"x": torch.arange(4)}, last=True)
        t.join(WAIT_S)
    assert got and got[0].tensors["x"].tolist() == [0, 1, 2, 3]


def test_producer_that_sends_and_closes_at_once_loses_nothing():
    name = edge_name()
    p = EdgeProducer(name, ipc_address(name), EdgeConfig(slots=4, slot_bytes=4096))
    c = EdgeConsumer(name, p.address)
    got: list = []

    def read_all():
        got.extend([c.recv(WAIT_S), c.recv(WAIT_S)])
        with pytest.raises(EdgeClosed):
            c.recv(WAIT_S)
        got.append("closed")

    try:
        assert c.recv(0.05) is None  # says Hello
        p.send(1, {"x": torch.arange(2048)}, seq=0)  # slot-borne
        p.send(1, {"x": torch.arange(3)}, seq=1, last=True)
        reader = threading.Thread(target=read_all, daemon=True)
        reader.start()  # it has not mapped the pool yet:
        p.close()  # close waits for that before unlinking the pool
        reader.join(WAIT_S)
    finally:
        c.close()
    assert got[2] == "closed"
    assert torch.equal(got[0].tensors["x"], torch.arange(2048)) and got[1].last


def test_consumer_sees_producer_close_after_the_data():
    name = edge_name()
    p = EdgeProducer(name, ipc_address(name), EdgeConfig(slots=2, slot_bytes=4096))
    c = EdgeConsumer(name, p.address)
    holder = {}
    t = threading.Thread(target=lambda: holder.setdefault("m", c.recv(WAIT_S)), daemon=True)
    t.start()
    p.send(1, {"x": torch.arange(10)}, last=True)
    t.join(WAIT_S)
    p.close()
    try:
        with pytest.raises(EdgeClosed, match="producer closed"):
            c.recv(WAIT_S)
    finally:
        c.close()
    assert holder["m"].tensors["x"].tolist() == list(range(10))


def test_wrong_edge_name_is_refused():
    name = edge_name()
    with EdgeProducer(name, ipc_address(name)) as p, EdgeConsumer("other", p.address) as c:
        assert c.recv(0.2) is None  # says Hello
        with pytest.raises(AttachTimeout):
            p.wait_attached(0.3)
        with pytest.raises(EdgeClosed, match=f"serves edge '{name}'"):
            c.recv(WAIT_S)


def test_send_rejects_what_the_wire_cannot_carry():
    name = edge_name()
    with EdgeProducer(name, ipc_address(name)) as p:
        with pytest.raises(TypeError):
            p.send(1, {"x": [1, 2, 3]})
        with pytest.raises(ValueError, match="dtype"):
            p.send(1, {"x": torch.zeros(2, dtype=torch.float8_e4m3fn)})
        with pytest.raises(ValueError, match="strided"):
            p.send(1, {"x": torch.eye(3).to_sparse()})
    with pytest.raises(EdgeClosed):
        p.send(1, {"x": torch.zeros(1)})


def test_cuda_plane_is_behind_a_capability_check():
    ok, why = cuda_ipc_available()
    name = edge_name()
    if ok:
        EdgeProducer(name, ipc_address(name), EdgeConfig(plane="cuda")).close()
    else:
        assert why
        with pytest.raises(RelayError, match="CUDA IPC"):
            EdgeProducer(name, ipc_address(name), EdgeConfig(plane="cuda"))


# ---------------------------------------------------------------- shared-memory hygiene

def test_close_unlinks_the_segment():
    name = edge_name()
    p = EdgeProducer(name, ipc_address(name), EdgeConfig(slots=2, slot_bytes=4096))
    mine = [s for s in list_segments(os.getpid()) if name in s]
    assert len(mine) == 1
    p.close()
    assert not os.path.exists(os.path.join(SHM_DIR, mine[0]))


def test_janitor_unlinks_segments_of_dead_owners_only():
    child = subprocess.Popen(["true"])
    child.wait()  # a pid that is certainly dead (reaped)
    live = ShmSlotPool.create("live", 1, 4096)
    orphan = f"omniduplex-{child.pid}-orphan-{uuid.uuid4().hex[:8]}"
    crashed = ShmSlotPool(orphan, 1, 4096, owner=True)
    crashed._finalizer.detach()  # simulate a crash: nothing unlinks it
    del crashed
    try:
        assert orphan in list_segments(child.pid)
        sweep_orphans()  # (another process's janitor may beat us to it: that is fine too)
        assert orphan not in list_segments() and live.name in list_segments()
    finally:
        live.close()
    assert live.name not in list_segments()


def test_byte_view_of_empty_tensors_from_numpy():
    import numpy as np

    # numpy-backed empty arrays come with stride 0, which torch refuses to view as bytes
    empties = (torch.from_numpy(np.zeros(0, np.float32)), torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    for t in empties:
        b = byte_view(t)
        assert b.dtype == torch.uint8 and b.numel() == 0
