"""Producer end of an edge: takes a credit, writes tensors into a slot, signals ``DataReady``.

Single-threaded by design: the socket is only read inside ``send``/``wait_attached``/``abort``, so
there is no background thread and no lock. Credits returned while the producer is busy elsewhere
wait in the socket and are collected at the next call. Use one ``EdgeProducer`` from one thread.

Liveness: while ``send`` waits, every ``probe_interval_s`` the producer pings the consumer through
the ROUTER with ``ROUTER_MANDATORY`` set (a vanished peer fails with ``EHOSTUNREACH``) and, when the
consumer is on this host, checks its pid. A dead consumer raises :class:`ConsumerDied` and every
in-flight slot is reclaimed; a new consumer saying ``Hello`` on the same address is welcomed with
a fresh epoch and full credits.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping

import torch
import zmq

from omniduplex.relay.edge import EdgeConfig, EdgeStats, RecentSet, make_socket
from omniduplex.relay.errors import (
    AttachTimeout,
    BackpressureTimeout,
    ConsumerDied,
    EdgeClosed,
    ProtocolError,
    RelayError,
)
from omniduplex.relay.layout import INLINE_ALIGN, SLOT_ALIGN, pack_inline, pieces, plan, prepare
from omniduplex.relay.messages import Abort, Bye, Credit, DataReady, Hello, Ping, Welcome, decode, encode
from omniduplex.relay.planes import open_writer
from omniduplex.relay.shm_pool import pid_alive

# plain ints: pyzmq's enum flags cost microseconds per use on the hot path
_EVENTS, _POLLIN, _SNDMORE, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.SNDMORE), int(zmq.NOBLOCK)


#: While credits are in hand, ``send`` reads returned credits, aborts and hellos at most this often (s).
_PUMP_EVERY_S = 0.0005


def _always() -> bool:
    return True


def _unlink_ipc(address: str) -> None:
    """Remove an ``ipc://`` socket file (libzmq unlinks it lazily on close, or not at all at exit)."""
    if address.startswith("ipc://"):
        with contextlib.suppress(OSError):
            os.unlink(address[len("ipc://"):])


class EdgeProducer:
    """Producer end of edge ``name``, bound at ``address`` (``ipc://``, ``tcp://`` or ``inproc://``)."""

    def __init__(self, name: str, address: str, config: EdgeConfig | None = None, *,
                 context: zmq.Context | None = None) -> None:
        """Bind the control socket and allocate the data plane (``config.slots`` × ``slot_bytes`` B)."""
        self.name = name
        self.config = config or EdgeConfig()
        self.stats = EdgeStats()
        self._host = socket.gethostname()
        self._sock = make_socket(context or zmq.Context.instance(), zmq.ROUTER, self.config.heartbeat_s)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._writer = None
        self.address = address
        try:
            self._sock.bind(address)
            self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT) or address
            self.plane = self.config.plane_for(address)
            self._writer = open_writer(self.plane, name, self.config.slots, self.config.slot_bytes)
        except BaseException:
            self._sock.close(linger=0)
            _unlink_ipc(self.address)
            raise
        self._consumer: bytes | None = None
        self._mapped = False  # the consumer has mapped the data plane (sent a credit this epoch)
        self._consumer_pid = 0
        self._consumer_local = False
        self._epoch = 0
        self._free: deque[int] = deque()
        self._inflight: set[int] = set()
        self._inline_free = 0
        self._aborted = RecentSet()
        self._error: RelayError | None = None
        self._last_probe = 0.0
        self._last_pump = 0.0
        self._closed = False

    # ------------------------------------------------------------------ public API

    @property
    def attached(self) -> bool:
        """Whether a consumer is attached (as of the last time the socket was read)."""
        return self._consumer is not None

    @property
    def free_slots(self) -> int:
        """Credits in hand (slots not lent to the consumer)."""
        return len(self._free) if self._consumer is not None else self.config.slots

    def collect(self) -> None:
        """Read returned credits, aborts and hellos now, without blocking (``send`` does this itself; call it
        before reading :attr:`slots_in_use` on an idle edge)."""
        self._check_open()
        self._pump()

    @property
    def slots_in_use(self) -> int:
        """Slots lent to the consumer (written, their credits not yet back), as of the last socket read."""
        return len(self._inflight)

    @property
    def inline_in_use(self) -> int:
        """Inline messages sent whose credits are not yet back (0 when no consumer is attached)."""
        return self.config.inline_window - self._inline_free if self._consumer is not None else 0

    def wait_attached(self, timeout_s: float) -> None:
        """Block until a consumer is attached; raises :class:`AttachTimeout` after ``timeout_s`` seconds."""
        self._check_open()
        self._pump()
        self._wait(_always, time.monotonic() + timeout_s, timeout_s)

    def send(self, request_id: int, tensors: Mapping[str, torch.Tensor], seq: int = 0, last: bool = False,
             timeout_s: float | None = None) -> bool:
        """Send chunk ``seq`` of ``request_id``: the named ``tensors`` (any of them may be empty).

        Blocks until a consumer is attached and enough credits came back, at most ``timeout_s``
        seconds (default ``config.send_timeout_s``) for the whole chunk. The tensors are copied once
        (into the slots) and may be reused as soon as this returns. Returns ``False`` without sending
        if ``request_id`` was aborted (by either end). Raises :class:`AttachTimeout`,
        :class:`BackpressureTimeout`, :class:`ConsumerDied` (credits reclaimed) or :class:`EdgeClosed`.
        """
        if self._closed:
            raise EdgeClosed(f"edge {self.name!r}: producer is closed")
        timeout = self.config.send_timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        deadline = now + timeout
        if now - self._last_pump >= _PUMP_EVERY_S:
            self._pump()
        if self._error is not None:
            self._raise_pending()
        if request_id in self._aborted:
            return False
        specs, flats = prepare(tensors)
        if self._consumer is None:
            self._wait(_always, deadline, timeout)
        epoch = self._epoch
        inline = plan(specs, INLINE_ALIGN)
        if inline.total <= self.config.inline_bytes and self.plane != "cuda":
            if self._inline_free <= 0:
                self._wait(self._has_inline_credit, deadline, timeout)
            msg = DataReady(epoch, request_id, seq, 0, inline.total, (), specs, last, True, False,
                            pack_inline(inline, flats))
            self._emit(msg, ())
            self._inline_free -= 1
            self.stats.inline_messages += 1
            self._count(inline.total)
            return True

        layout = plan(specs, SLOT_ALIGN)
        slot_bytes = self.config.slot_bytes
        offset = 0
        while offset < layout.total:
            if not self._free:
                self._wait(self._has_slot_credit, deadline, timeout)
            if self._epoch != epoch:
                raise ConsumerDied(f"edge {self.name!r}: consumer re-attached in the middle of a chunk")
            if request_id in self._aborted:
                return False  # the consumer aborted it mid-chunk and discards what it got
            want = math.ceil((layout.total - offset) / slot_bytes)
            take = min(want, len(self._free), self.config.frag_slots)
            slots = tuple(self._free.popleft() for _ in range(take))
            self._inflight.update(slots)
            self.stats.max_inflight_slots = max(self.stats.max_inflight_slots, len(self._inflight))
            stop = min(layout.total, offset + len(slots) * slot_bytes)
            for p in pieces(layout, offset, stop, slot_bytes):
                self._writer.put(slots[p.window], p.dst, flats[p.tensor][p.src:p.src + p.nbytes])
            msg = DataReady(epoch=epoch, request_id=request_id, seq=seq, frag_offset=offset,
                            frag_bytes=stop - offset, slots=slots, specs=specs if offset == 0 else (),
                            last=last, more=stop < layout.total)
            self._emit(msg, self._writer.take_frames())
            self._writer.release(max(deadline - time.monotonic(), 0.0))
            self.stats.fragments += 1
            offset = stop
        self._count(layout.total)
        return True

    def abort(self, request_id: int) -> None:
        """Cancel ``request_id``: the consumer drops its unread chunks (returning their credits) and
        later ``send`` calls for it return ``False``. Never raises for a dead consumer (the next
        ``send`` reports that)."""
        self._check_open()
        self._aborted.add(request_id)
        self._pump()
        if self._consumer is not None:
            try:
                self._emit(Abort(epoch=self._epoch, request_id=request_id), ())
            except EdgeClosed as e:
                self._error = e

    def close(self, linger_s: float = 1.0) -> None:
        """Say ``Bye`` to the consumer, close the socket and unlink the shared memory. Idempotent.

        If chunks are in flight to a consumer that has not yet mapped the pool (it says so with its
        first credit), wait up to ``linger_s`` seconds for it to map it before unlinking, so a
        producer that sends and closes at once does not take its last chunks with it.
        """
        if self._closed:
            return
        deadline = time.monotonic() + linger_s
        while self._consumer is not None and not self._mapped and self._inflight and self._error is None:
            if time.monotonic() >= deadline:
                break
            if self._sock.poll(10):
                self._pump()
        self._closed = True
        if self._consumer is not None:
            bye = encode(Bye(self._epoch, "producer closed"))
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send_multipart([self._consumer, bye], _NOBLOCK)
        self._sock.close(linger=200)
        _unlink_ipc(self.address)
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> EdgeProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise EdgeClosed(f"edge {self.name!r}: producer is closed")

    def _has_slot_credit(self) -> bool:
        return bool(self._free)

    def _has_inline_credit(self) -> bool:
        return self._inline_free > 0

    def _count(self, nbytes: int) -> None:
        self.stats.messages += 1
        self.stats.payload_bytes += nbytes

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _wait(self, ready: Callable[[], bool], deadline: float, timeout: float) -> None:
        """Pump the socket until a consumer is attached and ``ready()``; probes the consumer meanwhile."""
        waited = False
        while True:
            self._raise_pending()
            if self._consumer is not None and ready():
                return
            if not waited and self._consumer is not None:
                self.stats.credit_waits += 1
            waited = True
            now = time.monotonic()
            if now >= deadline:
                if self._consumer is None:
                    raise AttachTimeout(f"edge {self.name!r}: no consumer attached at {self.address} "
                                        f"within {timeout:.3g} s")
                raise BackpressureTimeout(
                    f"edge {self.name!r}: no credit within {timeout:.3g} s ({self.config.slots} slots of "
                    f"{self.config.slot_bytes} B, {len(self._inflight)} in flight, "
                    f"{self.config.inline_window - self._inline_free} inline unread): "
                    "consumer too slow or stuck")
            if self._consumer is not None and now - self._last_probe >= self.config.probe_interval_s:
                self._probe()
                continue
            if self._sock.poll(max(1, int(min(deadline - now, self.config.probe_interval_s) * 1000))):
                self._pump()

    def _probe(self) -> None:
        self._last_probe = time.monotonic()
        if self._consumer_local and not pid_alive(self._consumer_pid):
            self._lost(f"consumer process {self._consumer_pid} is gone")
            return
        try:
            self._sock.send_multipart([self._consumer, encode(Ping(self._epoch))], _NOBLOCK)
        except zmq.Again:
            pass
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self._lost("consumer disconnected")

    def _emit(self, msg: object, frames: list | tuple) -> None:
        try:
            if frames:
                self._sock.send_multipart([self._consumer, encode(msg), *frames], copy=False)
            else:
                self._sock.send(self._consumer, _SNDMORE)
                self._sock.send(encode(msg))
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self._pump()  # a Bye may be waiting: then this is a clean close, not a death
            if self._error is None:
                self._lost("consumer disconnected")
            self._raise_pending()

    def _lost(self, reason: str, error: type[EdgeClosed] = ConsumerDied) -> None:
        """Forget the consumer, reclaim every credit, and keep ``error`` for the caller."""
        n = len(self._inflight)
        self._consumer = None
        self._inflight.clear()
        self._free.clear()
        self._error = error(f"edge {self.name!r}: {reason}; {n} in-flight slot(s) reclaimed")

    def _pump(self) -> None:
        """Handle every control message waiting in the socket, without blocking."""
        self._last_pump = time.monotonic()
        sock = self._sock
        while sock.get(_EVENTS) & _POLLIN:
            ident, body, *_ = sock.recv_multipart(_NOBLOCK)
            try:
                msg = decode(body)
            except ProtocolError:
                self.stats.bad_messages += 1
                continue
            if isinstance(msg, Hello):
                self._hello(ident, msg)
            elif ident != self._consumer or msg.epoch != self._epoch:
                continue  # from a previous consumer or a previous epoch
            elif isinstance(msg, Credit):
                self._mapped = True
                for s in msg.slots:
                    if s in self._inflight:
                        self._inflight.remove(s)
                        self._free.append(s)
                self._inline_free = min(self.config.inline_window, self._inline_free + msg.inline)
            elif isinstance(msg, Abort):
                self._aborted.add(msg.request_id)
            elif isinstance(msg, Bye):
                self._lost(f"consumer closed the edge ({msg.reason})", EdgeClosed)

    def _hello(self, ident: bytes, msg: Hello) -> None:
        if msg.edge != self.name:
            bye = encode(Bye(0, f"this address serves edge {self.name!r}"))
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send_multipart([ident, bye], _NOBLOCK)
            return
        outstanding = len(self._inflight) + self.config.inline_window - self._inline_free
        if self._consumer is not None and outstanding:
            self._lost(f"consumer replaced by pid {msg.pid}")
        self._consumer = ident
        self._mapped = False
        self._consumer_pid = msg.pid
        self._consumer_local = msg.host == self._host
        self._epoch = secrets.randbits(32) or 1
        self._free = deque(range(self.config.slots))
        self._inflight.clear()
        self._inline_free = self.config.inline_window
        self._last_probe = time.monotonic()
        self.stats.attaches += 1
        welcome = Welcome(epoch=self._epoch, edge=self.name, plane=self.plane, slots=self.config.slots,
                          slot_bytes=self.config.slot_bytes, inline_window=self.config.inline_window,
                          pid=os.getpid(), host=self._host, descriptor=self._writer.descriptor)
        try:
            self._sock.send_multipart([ident, encode(welcome)], _NOBLOCK)
        except zmq.ZMQError:
            self._consumer = None  # it left already
