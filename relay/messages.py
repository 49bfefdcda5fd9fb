"""Control-plane messages of an edge and their compact binary encoding (``struct``, little endian).

Every message starts with an 8-byte header ``<B kind, B flags, H count, I epoch>``. The epoch names
one attachment of a consumer to a producer; both ends drop messages of another epoch, so credits or
chunks of a dead consumer can never leak into its successor. A one-tensor ``DataReady`` is about
50 bytes.

Wire (after the header):

- ``Hello``     ``<I pid> <H n> edge <H n> host``                         consumer → producer
- ``Welcome``   ``<I slots, Q slot_bytes, I inline_window, I pid, B plane> <H n> edge <H n> host
  <I n> descriptor``                                                       producer → consumer
- ``DataReady`` ``<Q request_id, I seq, Q frag_offset, Q frag_bytes> <H>*count slots`` then, in the
  first fragment only, ``<B ntensors>`` and per tensor ``<B dtype, B ndim, B n> name <I>*ndim``.
  An inline payload follows, to the end of the message.                  producer → consumer
- ``Credit``    ``<I inline> <H>*count slots``                             consumer → producer
- ``Abort``     ``<Q request_id>``                                         both ways
- ``Ping``      (header only)                                              producer → consumer
- ``Bye``       ``<H n> reason``                                           both ways
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from enum import IntEnum

from omniduplex.relay.errors import ProtocolError
from omniduplex.relay.layout import DTYPE_CODE, DTYPES, TensorSpec

HEADER = struct.Struct("<BBHI")
_HELLO = struct.Struct("<I")
_WELCOME = struct.Struct("<IQIIB")
_DATA = struct.Struct("<QIQQ")
_CREDIT = struct.Struct("<I")
_ABORT = struct.Struct("<Q")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_TENSOR = struct.Struct("<BBB")

#: Data planes, by wire code.
PLANES: tuple[str, ...] = ("shm", "frames", "cuda")

MAX_SLOTS = 0xFFFF


class Kind(IntEnum):
    """Kind byte of a control message."""

    HELLO = 1
    WELCOME = 2
    DATA = 3
    CREDIT = 4
    ABORT = 5
    PING = 6
    BYE = 7


# DataReady flags
LAST = 1  # last chunk of the request
INLINE = 2  # payload rides in the next ZMQ frame, no slots
MORE = 4  # more fragments of this message follow


@dataclass(slots=True)
class Hello:
    """Consumer asks to attach to ``edge`` (sent on every (re)connection)."""

    edge: str
    pid: int
    host: str
    epoch: int = 0


@dataclass(slots=True)
class Welcome:
    """Producer accepts a consumer: new ``epoch``, data plane and slot geometry (bytes)."""

    epoch: int
    edge: str
    plane: str
    slots: int
    slot_bytes: int
    inline_window: int
    pid: int
    host: str
    descriptor: bytes = b""


@dataclass(slots=True)
class DataReady:
    """A fragment of a message is ready: in ``slots`` (in payload order) or inline in ``payload``.

    ``frag_offset``/``frag_bytes`` locate the fragment in the message payload (bytes). ``specs`` is
    present only in the first fragment (``frag_offset == 0``).
    """

    epoch: int
    request_id: int
    seq: int
    frag_offset: int
    frag_bytes: int
    slots: tuple[int, ...] = ()
    specs: tuple[TensorSpec, ...] = ()
    last: bool = False
    inline: bool = False
    more: bool = False
    payload: bytes = b""  # the whole message payload, when ``inline``


@dataclass(slots=True)
class Credit:
    """Consumer returns ``slots`` and ``inline`` inline-window credits."""

    epoch: int
    slots: tuple[int, ...] = ()
    inline: int = 0


@dataclass(slots=True)
class Abort:
    """Drop every chunk of ``request_id`` not yet read, and every later one."""

    epoch: int
    request_id: int


@dataclass(slots=True)
class Ping:
    """Liveness probe; the receiver ignores it."""

    epoch: int = 0


@dataclass(slots=True)
class Bye:
    """The sender closes the edge."""

    epoch: int = 0
    reason: str = ""


ControlMessage = Hello | Welcome | DataReady | Credit | Abort | Ping | Bye


def _str(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0xFFFF:
        raise ValueError("string too long for the control plane")
    return _U16.pack(len(b)) + b


@functools.lru_cache(maxsize=256)
def _array(code: str, n: int) -> struct.Struct:
    return struct.Struct(f"<{n}{code}")


def _slots(slots: tuple[int, ...]) -> bytes:
    if len(slots) > MAX_SLOTS:
        raise ValueError(f"at most {MAX_SLOTS} slots per message")
    return _array("H", len(slots)).pack(*slots)


def encode(msg: ControlMessage) -> bytes:
    """Binary form of ``msg`` (a few dozen bytes)."""
    if isinstance(msg, DataReady):
        flags = (LAST if msg.last else 0) | (INLINE if msg.inline else 0) | (MORE if msg.more else 0)
        parts = [HEADER.pack(Kind.DATA, flags, len(msg.slots), msg.epoch),
                 _DATA.pack(msg.request_id, msg.seq, msg.frag_offset, msg.frag_bytes), _slots(msg.slots)]
        if msg.frag_offset == 0:
            parts.append(_U8.pack(len(msg.specs)))
            for spec in msg.specs:
                name = spec.name.encode()
                parts.append(_TENSOR.pack(DTYPE_CODE[spec.dtype], len(spec.shape), len(name)))
                parts.append(name)
                parts.append(_array("I", len(spec.shape)).pack(*spec.shape))
        if msg.inline:
            parts.append(msg.payload)
        return b"".join(parts)
    if isinstance(msg, Credit):
        return HEADER.pack(Kind.CREDIT, 0, len(msg.slots), msg.epoch) + _CREDIT.pack(msg.inline) + _slots(
            msg.slots)
    if isinstance(msg, Abort):
        return HEADER.pack(Kind.ABORT, 0, 0, msg.epoch) + _ABORT.pack(msg.request_id)
    if isinstance(msg, Ping):
        return HEADER.pack(Kind.PING, 0, 0, msg.epoch)
    if isinstance(msg, Bye):
        return HEADER.pack(Kind.BYE, 0, 0, msg.epoch) + _str(msg.reason)
    if isinstance(msg, Hello):
        head = HEADER.pack(Kind.HELLO, 0, 0, msg.epoch)
        return head + _HELLO.pack(msg.pid) + _str(msg.edge) + _str(msg.host)
    if isinstance(msg, Welcome):
        return b"".join([
            HEADER.pack(Kind.WELCOME, 0, 0, msg.epoch),
            _WELCOME.pack(msg.slots, msg.slot_bytes, msg.inline_window, msg.pid, PLANES.index(msg.plane)),
            _str(msg.edge), _str(msg.host), _U32.pack(len(msg.descriptor)), msg.descriptor,
        ])
    raise TypeError(f"not a control message: {type(msg).__name__}")


def _text(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(buf, pos)
    pos += 2
    if pos + n > len(buf):
        raise struct.error("string runs past the end")
    return buf[pos:pos + n].decode(), pos + n


def _decode_data(buf: bytes, flags: int, count: int, epoch: int) -> DataReady:
    """The hot path: a ``DataReady`` (``struct.error`` on truncation, handled by :func:`decode`)."""
    request_id, seq, frag_offset, frag_bytes = _DATA.unpack_from(buf, 8)
    pos = 8 + _DATA.size
    slots: tuple[int, ...] = ()
    if count:
        slots = _array("H", count).unpack_from(buf, pos)
        pos += 2 * count
    specs: tuple[TensorSpec, ...] = ()
    if frag_offset == 0:
        ntensors = buf[pos]
        pos += 1
        out = []
        for _ in range(ntensors):
            code, ndim, nlen = _TENSOR.unpack_from(buf, pos)
            pos += 3
            if code >= len(DTYPES):
                raise ProtocolError(f"unknown dtype code {code}")
            name = buf[pos:pos + nlen].decode()
            pos += nlen
            shape = _array("I", ndim).unpack_from(buf, pos) if ndim else ()
            pos += 4 * ndim
            out.append(TensorSpec(name, DTYPES[code], shape))
        specs = tuple(out)
    inline = bool(flags & INLINE)
    payload = b""
    if inline:
        payload = buf[pos:]
        if len(payload) != frag_bytes:
            raise ProtocolError(f"inline payload of {len(payload)} B, header says {frag_bytes} B")
    elif len(buf) != pos:
        raise ProtocolError("trailing bytes after a DataReady")
    return DataReady(epoch, request_id, seq, frag_offset, frag_bytes, slots, specs, bool(flags & LAST),
                     inline, bool(flags & MORE), payload)


def decode(buf: bytes) -> ControlMessage:
    """Parse one control message; raises :class:`ProtocolError` on anything malformed."""
    try:
        kind, flags, count, epoch = HEADER.unpack_from(buf, 0)
        pos = HEADER.size
        if kind == Kind.DATA:
            return _decode_data(buf, flags, count, epoch)
        if kind == Kind.CREDIT:
            (inline,) = _CREDIT.unpack_from(buf, pos)
            slots = _array("H", count).unpack_from(buf, pos + 4) if count else ()
            return Credit(epoch, slots, inline)
        if kind == Kind.ABORT:
            return Abort(epoch, _ABORT.unpack_from(buf, pos)[0])
        if kind == Kind.PING:
            return Ping(epoch)
        if kind == Kind.BYE:
            return Bye(epoch, _text(buf, pos)[0])
        if kind == Kind.HELLO:
            (pid,) = _HELLO.unpack_from(buf, pos)
            edge, pos = _text(buf, pos + _HELLO.size)
            host, pos = _text(buf, pos)
            return Hello(edge, pid, host, epoch)
        if kind == Kind.WELCOME:
            slots, slot_bytes, window, pid, plane = _WELCOME.unpack_from(buf, pos)
            if plane >= len(PLANES):
                raise ProtocolError(f"unknown data plane code {plane}")
            edge, pos = _text(buf, pos + _WELCOME.size)
            host, pos = _text(buf, pos)
            (n,) = _U32.unpack_from(buf, pos)
            if pos + 4 + n > len(buf):
                raise struct.error("descriptor runs past the end")
            return Welcome(epoch, edge, PLANES[plane], slots, slot_bytes, window, pid, host,
                           bytes(buf[pos + 4:pos + 4 + n]))
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed control message: {e}") from None
    raise ProtocolError(f"unknown control message kind {kind}")
