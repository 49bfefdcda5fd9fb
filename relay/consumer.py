"""Consumer end of an edge: reads ``DataReady``, copies the slots into fresh tensors, returns credits.

The consumer connects a DEALER to the producer's address and watches it with a ZMQ socket monitor:
every (re)connection sends ``Hello``, so a restarted producer, or a restarted consumer, re-attaches
by itself (the consumer only talks inside ``recv``/``wait_attached``/``abort``, so it attaches at
its first such call); a disconnection without ``Bye`` raises :class:`ProducerDied` (after
unlinking the dead producer's shared memory). Control messages are drained eagerly (so an
``Abort`` can drop chunks that are queued but not yet read), but slots are copied out only as
``recv`` is called: the consumer never holds more than the producer's credits allow, so memory
stays bounded.
Use one ``EdgeConsumer`` from one thread.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass

import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from omniduplex.relay.edge import EdgeStats, Message, RecentSet, make_socket
from omniduplex.relay.errors import AttachTimeout, EdgeClosed, ProducerDied, ProtocolError, RelayError
from omniduplex.relay.layout import (
    INLINE_ALIGN,
    SLOT_ALIGN,
    Bytes,
    Layout,
    allocate,
    pieces,
    plan,
    unpack_inline,
)
from omniduplex.relay.messages import Abort, Bye, Credit, DataReady, Hello, Welcome, decode, encode
from omniduplex.relay.planes import PlaneReader, open_reader
from omniduplex.relay.shm_pool import sweep_after_exit

# plain ints: pyzmq's enum flags cost microseconds per use on the hot path
_EVENTS, _POLLIN, _RCVMORE, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE), int(zmq.NOBLOCK)


@dataclass
class _Partial:
    """A message whose first fragments have been copied out, waiting for the rest."""

    request_id: int
    seq: int
    last: bool
    layout: Layout
    tensors: dict[str, torch.Tensor]
    flats: list[Bytes]
    next_offset: int


class EdgeConsumer:
    """Consumer end of edge ``name``, connected to the producer at ``address``."""

    def __init__(self, name: str, address: str, *, heartbeat_s: float = 1.0,
                 context: zmq.Context | None = None) -> None:
        """Connect to ``address`` (the producer may bind later; the consumer attaches when it does)."""
        self.name = name
        self.address = address
        self.stats = EdgeStats()
        self.welcome: Welcome | None = None
        self._sock = make_socket(context or zmq.Context.instance(), zmq.DEALER, heartbeat_s)
        self._sock.setsockopt(zmq.ROUTING_ID, f"{os.getpid()}:{secrets.token_hex(4)}".encode())
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._poll_items = [(self._sock, _POLLIN), (self._monitor, _POLLIN)]
        self._hello = encode(Hello(edge=name, pid=os.getpid(), host=socket.gethostname()))
        self._reader: PlaneReader | None = None
        self._epoch: int | None = None
        self._pending: deque[tuple[DataReady | Bye, list]] = deque()
        self._partial: _Partial | None = None
        self._credit_inline = 0  # credits owed to the producer, returned in batches
        self._credit_slots: list[int] = []
        self._inline_batch = 1
        self._slot_batch = 1
        self._aborted = RecentSet()
        self._error: RelayError | None = None
        self._closed = False
        self._sock.connect(address)

    @property
    def attached(self) -> bool:
        """Whether the producer has welcomed this consumer (as of the last ``recv``)."""
        return self._epoch is not None

    @property
    def sockets(self) -> tuple[zmq.Socket, zmq.Socket]:
        """The data socket and its monitor, for a caller that waits on several things at once (a
        ``zmq.Poller``): when either is readable, ``recv(timeout_s=0)`` has work (a message, or a
        (re)connection event it handles). When ``recv`` has returned ``None``, nothing is left buffered
        outside them, so blocking on these sockets cannot miss a message."""
        return self._sock, self._monitor

    def wait_attached(self, timeout_s: float) -> None:
        """Block until the producer has welcomed this consumer; raises :class:`AttachTimeout` after
        ``timeout_s`` seconds. (``recv`` attaches by itself; this is for a consumer that wants to be
        attached before it starts reading.)"""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            self._drain_socket()
            self._raise_pending()
            if self._epoch is not None:
                return
            if not self._block(deadline):
                raise AttachTimeout(f"edge {self.name!r}: no producer welcomed us at {self.address} "
                                    f"within {timeout_s:.3g} s")

    def recv(self, timeout_s: float | None = None) -> Message | None:
        """Next complete message, in send order; ``None`` if none completes within ``timeout_s`` seconds
        (``None`` = wait forever). The tensors are fresh (one copy out of the slot) and owned by the
        caller. Raises :class:`ProducerDied` or :class:`EdgeClosed` (after the messages sent before it).
        """
        self._check_open()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._drain_socket()
            self._raise_pending()
            while self._pending:
                msg, frames = self._pending.popleft()
                if isinstance(msg, Bye):
                    self._detach()
                    raise EdgeClosed(f"edge {self.name!r}: producer closed the edge ({msg.reason})")
                out = self._consume(msg, frames)
                if out is not None:
                    return out
            self._flush_credits()  # nothing left to read: no credit stays owed while the edge is idle
            if not self._block(deadline) and not self._pending and self._error is None:
                return None  # (handling a disconnection may have read messages or set an error: not yet)

    def abort(self, request_id: int) -> None:
        """Drop every unread chunk of ``request_id`` (returning its credits), ignore later ones, and
        tell the producer, whose later ``send`` calls for it return ``False``."""
        self._check_open()
        self._aborted.add(request_id)
        self._drop_request(request_id)
        if self._epoch is not None:
            self._send(Abort(epoch=self._epoch, request_id=request_id))

    def close(self) -> None:
        """Say ``Bye`` to the producer and release sockets and mappings. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._epoch is not None:
            self._send(Bye(epoch=self._epoch, reason="consumer closed"))
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=200)
        self._detach()

    def __enter__(self) -> EdgeConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise EdgeClosed(f"edge {self.name!r}: consumer is closed")

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _send(self, msg: object) -> None:
        with contextlib.suppress(zmq.Again):  # no connection at all: the producer is gone
            self._sock.send(encode(msg), _NOBLOCK)

    def _owe(self, slots: tuple[int, ...] = (), inline: int = 0) -> None:
        """Record credits to return; send them once a batch is due (a quarter of the pool, half the
        inline window), or when the consumer runs out of messages (:meth:`_flush_credits`). The producer
        can only run out of credits while this consumer has unread messages, which it will read, so
        batching never deadlocks; it halves the control traffic under load, and an idle edge holds none."""
        self._credit_slots.extend(slots)
        self._credit_inline += inline
        if len(self._credit_slots) >= self._slot_batch or self._credit_inline >= self._inline_batch:
            self._flush_credits()

    def _flush_credits(self) -> None:
        """Send every credit owed now."""
        if self._credit_slots or self._credit_inline:
            if self._epoch is not None:
                self._send(Credit(self._epoch, tuple(self._credit_slots), self._credit_inline))
            self._credit_slots.clear()
            self._credit_inline = 0

    def _return(self, msg: DataReady) -> None:
        """Give back the credits of a chunk that is dropped unread."""
        self.stats.dropped_chunks += 1
        self._owe(msg.slots, int(msg.inline))

    def _drop_request(self, request_id: int) -> None:
        keep: deque[tuple[DataReady | Bye, list]] = deque()
        for msg, frames in self._pending:
            if isinstance(msg, DataReady) and msg.request_id == request_id:
                self._return(msg)
            else:
                keep.append((msg, frames))
        self._pending = keep
        if self._partial is not None and self._partial.request_id == request_id:
            self._partial = None

    def _detach(self) -> None:
        self._epoch = None
        self._pending.clear()
        self._partial = None
        self._credit_inline = 0
        self._credit_slots.clear()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _attach(self, welcome: Welcome) -> None:
        self._detach()
        if welcome.edge != self.name:
            self._error = EdgeClosed(f"edge {self.name!r}: {self.address} serves edge {welcome.edge!r}")
            return
        try:
            self._reader = open_reader(welcome)
        except FileNotFoundError:  # the producer closed (and unlinked its pool) before we got here
            self._error = ProducerDied(f"edge {self.name!r}: the producer's slot pool is gone")
            return
        self._epoch = welcome.epoch
        self._send(Credit(welcome.epoch))  # "mapped": the producer may unlink the pool from now on
        self._inline_batch = max(1, welcome.inline_window // 2)
        self._slot_batch = max(1, welcome.slots // 4)
        self.welcome = welcome
        self.stats.attaches += 1

    def _block(self, deadline: float | None) -> bool:
        """Wait until the socket or its monitor has something, and handle the monitor's events;
        ``False`` once ``deadline`` has passed (after one last non-blocking look, so that even
        ``recv(timeout_s=0)`` attaches). Events are only looked at here, when there is nothing to
        read: a connection change matters only then, and it keeps a syscall off the hot path."""
        if deadline is None:
            ready, go_on = zmq.zmq_poll(self._poll_items), True
        else:
            remaining = deadline - time.monotonic()
            go_on = remaining > 0
            ready = zmq.zmq_poll(self._poll_items, max(1, int(remaining * 1000)) if go_on else 0)
        if any(s is self._monitor for s, _ in ready):
            self._drain_events()
        return go_on

    def _drain_events(self) -> None:
        """Handle the socket monitor's events: say Hello on connect, detect a vanished producer."""
        while self._monitor.get(_EVENTS) & _POLLIN:
            event = recv_monitor_message(self._monitor, _NOBLOCK)["event"]
            if event == zmq.EVENT_CONNECTED:
                self._sock.send(self._hello, _NOBLOCK)
            elif event == zmq.EVENT_DISCONNECTED and self._epoch is not None:
                self._drain_socket()  # a Bye sent just before the close is a clean end
                if not any(isinstance(m, Bye) for m, _ in self._pending):
                    welcome = self.welcome
                    self._detach()
                    if welcome.plane == "shm" and welcome.host == socket.gethostname():
                        sweep_after_exit(welcome.pid)
                    self._error = ProducerDied(f"edge {self.name!r}: producer (pid {welcome.pid}) "
                                               "disconnected")

    def _drain_socket(self) -> None:
        sock = self._sock
        while sock.get(_EVENTS) & _POLLIN:
            head = sock.recv(_NOBLOCK)
            frames = []
            while sock.get(_RCVMORE):  # payload frames (frames plane): zero-copy
                frames.append(sock.recv(_NOBLOCK, copy=False))
            try:
                msg = decode(head)
            except ProtocolError:
                self.stats.bad_messages += 1
                continue
            if isinstance(msg, Welcome):
                self._attach(msg)
            elif isinstance(msg, Bye) and (msg.epoch == self._epoch or msg.epoch == 0):
                self._pending.append((msg, []))
            elif msg.epoch != self._epoch or self._epoch is None:
                continue  # stale: from before the current attachment
            elif isinstance(msg, DataReady):
                if msg.request_id in self._aborted:
                    self._return(msg)
                else:
                    self._pending.append((msg, frames))
            elif isinstance(msg, Abort):
                self._aborted.add(msg.request_id)
                self._drop_request(msg.request_id)

    def _consume(self, msg: DataReady, frames: list) -> Message | None:
        """Copy one fragment out of its slots, return its credits; the message if it is now complete."""
        if msg.inline:
            layout = plan(msg.specs, INLINE_ALIGN)
            tensors = unpack_inline(layout, msg.payload)
            self._owe(inline=1)
            return self._deliver(msg.request_id, msg.seq, msg.last, layout.total, tensors, inline=True)
        part = self._partial
        if msg.frag_offset == 0:
            tensors, flats = allocate(msg.specs, self._reader.device)
            part = _Partial(msg.request_id, msg.seq, msg.last, plan(msg.specs, SLOT_ALIGN), tensors, flats, 0)
        elif part is None or part.request_id != msg.request_id or part.next_offset != msg.frag_offset:
            self._return(msg)
            self._partial = None
            raise ProtocolError(f"edge {self.name!r}: fragment at byte {msg.frag_offset} of request "
                                f"{msg.request_id} does not continue the message being assembled")
        reader = self._reader
        reader.begin(frames)
        stop = msg.frag_offset + msg.frag_bytes
        for p in pieces(part.layout, msg.frag_offset, stop, self.welcome.slot_bytes):
            reader.get(msg.slots[p.window], p.dst, part.flats[p.tensor][p.src:p.src + p.nbytes])
        reader.finish()
        self._owe(msg.slots)
        self.stats.fragments += 1
        part.next_offset = stop
        if msg.more:
            self._partial = part
            return None
        self._partial = None
        return self._deliver(part.request_id, part.seq, part.last, part.layout.total, part.tensors, False)

    def _deliver(self, request_id: int, seq: int, last: bool, nbytes: int, tensors: dict[str, torch.Tensor],
                 inline: bool) -> Message:
        stats = self.stats
        stats.messages += 1
        stats.payload_bytes += nbytes
        stats.inline_messages += inline
        return Message(request_id, seq, last, tensors)
