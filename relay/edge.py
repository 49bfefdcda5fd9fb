"""What both ends of an edge share: configuration, the delivered message, counters, sockets, addresses.

An *edge* is one directed producer stage → consumer stage link. The producer binds a ZMQ ROUTER at
the edge's address and owns the data plane (the slots); the consumer connects a DEALER, says
``Hello`` on every (re)connection, and gets a ``Welcome`` naming the data plane and a fresh epoch.
See :mod:`.producer` and :mod:`.consumer` for the two ends.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import zmq

from omniduplex.relay.messages import MAX_SLOTS, PLANES


@dataclass(frozen=True)
class EdgeConfig:
    """Per-edge knobs, set on the producer (the consumer learns them from the ``Welcome``).

    - ``slots`` × ``slot_bytes``: the data plane's pre-allocated memory (bytes); a payload larger
      than a slot spans several slots, one larger than the pool streams through it.
    - ``inline_bytes``: payloads up to this size (bytes) ride in the control message instead (one
      4 KiB hidden state or codec frame is cheaper to copy than to signal a slot for).
    - ``inline_window``: at most this many inline messages unread by the consumer.
    - ``plane``: ``"auto"`` (``shm`` for ``ipc://``/``inproc://``, ``frames`` for ``tcp://``),
      ``"shm"``, ``"frames"`` or ``"cuda"``.
    - ``send_timeout_s``: default time (seconds) ``send`` waits for a consumer or a credit.
    - ``probe_interval_s``: while waiting, how often (seconds) the producer checks the consumer lives.
    - ``heartbeat_s``: ZMTP heartbeat interval (seconds); a silent peer is dropped after 3 of them.
    - ``max_frag_slots``: slots filled before signalling, 0 = half the pool (so the consumer can
      drain one half while the producer fills the other).
    """

    slots: int = 4
    slot_bytes: int = 1 << 20
    inline_bytes: int = 4096
    inline_window: int = 64
    plane: str = "auto"
    send_timeout_s: float = 10.0
    probe_interval_s: float = 0.1
    heartbeat_s: float = 1.0
    max_frag_slots: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ValueError(f"slots must be in [1, {MAX_SLOTS}], got {self.slots}")
        if self.slot_bytes < 1:
            raise ValueError(f"slot_bytes must be positive, got {self.slot_bytes}")
        if self.inline_bytes < 0 or self.inline_window < 1:
            raise ValueError("inline_bytes must be >= 0 and inline_window >= 1")
        if self.plane != "auto" and self.plane not in PLANES:
            raise ValueError(f"plane must be 'auto' or one of {PLANES}, got {self.plane!r}")
        if self.send_timeout_s <= 0 or self.probe_interval_s <= 0 or self.heartbeat_s <= 0:
            raise ValueError("timeouts and intervals must be positive")

    @property
    def frag_slots(self) -> int:
        """Most slots one fragment fills before it is signalled."""
        return self.max_frag_slots or max(1, self.slots // 2)

    def plane_for(self, address: str) -> str:
        """The data plane this config selects for ``address``."""
        if self.plane != "auto":
            return self.plane
        return "frames" if address.startswith("tcp://") else "shm"


@dataclass(slots=True)
class Message:
    """One delivered chunk: the named tensors of chunk ``seq`` of ``request_id`` (``last`` ends it)."""

    request_id: int
    seq: int
    last: bool
    tensors: dict[str, torch.Tensor]


@dataclass
class EdgeStats:
    """Counters of one end of an edge (payload in bytes)."""

    messages: int = 0
    payload_bytes: int = 0
    inline_messages: int = 0
    fragments: int = 0
    credit_waits: int = 0
    max_inflight_slots: int = 0
    attaches: int = 0
    dropped_chunks: int = 0
    bad_messages: int = 0


@dataclass
class RecentSet:
    """The last ``capacity`` ids added (aborted request ids): bounded memory, O(1) membership."""

    capacity: int = 4096
    _items: OrderedDict = field(default_factory=OrderedDict)

    def add(self, item: int) -> None:
        """Remember ``item``, forgetting the oldest beyond ``capacity``."""
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._items


def ipc_address(edge: str, directory: str | None = None) -> str:
    """Default ``ipc://`` address of ``edge`` (a socket file in the temp dir, path < 100 chars)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", edge)[:48]
    base = directory or tempfile.gettempdir()
    return f"ipc://{os.path.join(base, f'omniduplex-relay-{slug}.sock')}"


def make_socket(ctx: zmq.Context, kind: int, heartbeat_s: float) -> zmq.Socket:
    """A ZMQ socket with unbounded queues (credits bound them), ZMTP heartbeats and fast reconnects."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    ms = int(heartbeat_s * 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 3 * ms)
    sock.setsockopt(zmq.RECONNECT_IVL, 50)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
    return sock
