"""RTP for one call (RFC 3550), G.711 at 20 ms, and RFC 4733 telephone events.

* Packets: 12-byte header (V=2, P, X, CC, M, PT, sequence, timestamp, SSRC), CSRCs, an optional header
  extension and padding are skipped on receipt. We send one 20 ms G.711 frame (160 bytes) per packet,
  timestamp += 160 (the 8 kHz RTP clock), our own random SSRC, the marker bit on the first packet.
* Receipt: only packets from the address the SDP gave (``remote``) with the negotiated payload type (or the
  telephone-event type) are accepted; anything else is counted and dropped.
* :class:`JitterBuffer`: reorders by sequence number (with 16-bit wrap) and plays one frame per 20 ms tick
  after ``depth`` frames have queued; a missing frame is played as silence, a late one is dropped, a backlog
  beyond ``max_depth`` is cut back (the sender's clock runs fast).
* RFC 4733 events: 4 bytes ``event, E|R|volume, duration``; a digit is reported once, at its first packet
  with the E (end) bit (the end packet is sent three times, same timestamp).
* Ports: an even port per call from the configured range (RTCP would be +1; we neither send nor read RTCP).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("omniduplex.phone.sip.rtp")

HEADER = struct.Struct("!BBHII")
DTMF_EVENTS = "0123456789*#ABCD"
"""RFC 4733 §3.2 event codes 0–15."""


@dataclass
class RtpPacket:
    pt: int
    seq: int
    ts: int
    ssrc: int
    marker: bool
    payload: bytes


def parse_rtp(data: bytes) -> RtpPacket | None:
    """An RTP packet, or ``None`` when ``data`` is not RTP version 2 or is truncated."""
    if len(data) < 12:
        return None
    b0, b1, seq, ts, ssrc = HEADER.unpack_from(data)
    if b0 >> 6 != 2:
        return None
    offset = 12 + 4 * (b0 & 0x0F)
    if b0 & 0x10:  # header extension: 16-bit profile, 16-bit length in words
        if len(data) < offset + 4:
            return None
        offset += 4 + 4 * struct.unpack_from("!H", data, offset + 2)[0]
    end = len(data)
    if b0 & 0x20:  # padding: the last byte counts the padding bytes
        end -= data[-1]
    if offset > end:
        return None
    return RtpPacket(b1 & 0x7F, seq, ts, ssrc, bool(b1 & 0x80), data[offset:end])


def build_rtp(pt: int, seq: int, ts: int, ssrc: int, payload: bytes, marker: bool = False) -> bytes:
    return HEADER.pack(0x80, (0x80 if marker else 0) | pt, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc) + payload


def parse_dtmf(payload: bytes) -> tuple[str, bool, int] | None:
    """RFC 4733 payload → ``(digit, end, duration in timestamp units)``; ``None`` if not 0–15 or short."""
    if len(payload) < 4 or payload[0] >= len(DTMF_EVENTS):
        return None
    return DTMF_EVENTS[payload[0]], bool(payload[1] & 0x80), struct.unpack_from("!H", payload, 2)[0]


class JitterBuffer:
    """Reorders frames by RTP sequence number and releases one per :meth:`pop` (module docstring).

    Args:
        depth: frames queued before playing starts (and after an underrun) — the added delay (×20 ms).
        max_depth: frames held at most; older ones are dropped to catch up.
    """

    def __init__(self, depth: int = 3, max_depth: int = 15) -> None:
        self.depth, self.max_depth = depth, max_depth
        self.frames: dict[int, bytes] = {}
        self.next: int | None = None  # extended sequence number to play next
        self.highest: int | None = None
        self.playing = False
        self.lost = self.late = self.underruns = 0

    def _extend(self, seq: int) -> int:
        if self.highest is None:
            return seq
        base = self.highest & ~0xFFFF
        cands = (base - 0x10000 + seq, base + seq, base + 0x10000 + seq)
        return min(cands, key=lambda c: abs(c - self.highest))

    def reset(self) -> None:
        """Forget everything (a new SSRC: the sender restarted its stream)."""
        self.frames.clear()
        self.next = self.highest = None
        self.playing = False

    def push(self, seq: int, payload: bytes) -> None:
        ext = self._extend(seq)
        if self.next is not None and ext < self.next:
            self.late += 1
            return
        self.highest = ext if self.highest is None else max(self.highest, ext)
        self.frames[ext] = payload
        if self.next is None:
            self.next = ext
        if len(self.frames) > self.max_depth:  # the sender runs ahead of our clock: skip to catch up
            for k in sorted(self.frames)[: len(self.frames) - self.depth]:
                del self.frames[k]
            self.next = min(self.frames)

    def pop(self) -> bytes | None:
        """The frame due now, or ``None`` (lost, or nothing buffered: play silence)."""
        if not self.playing:
            if len(self.frames) < self.depth:
                return None
            self.playing, self.next = True, min(self.frames)
        if not self.frames:
            self.playing = False
            self.underruns += 1
            return None
        frame = self.frames.pop(self.next, None)
        if frame is None:
            self.lost += 1
        self.next += 1
        return frame


class PortPool:
    """Even UDP ports from ``[low, high]`` for RTP, handed out and returned by calls."""

    def __init__(self, low: int, high: int) -> None:
        self.free = list(range(low + (low & 1), high + 1, 2))

    def take(self) -> int:
        """Raises ``RuntimeError`` when every port is in use."""
        if not self.free:
            raise RuntimeError("no free RTP port")
        return self.free.pop(0)

    def give(self, port: int) -> None:
        if port not in self.free:
            self.free.append(port)


class RtpEndpoint(asyncio.DatagramProtocol):
    """The call's RTP socket: filters and parses incoming packets, sends ours.

    ``on_packet(packet)`` is called for each accepted packet (from ``remote``, with an expected
    payload type); ``remote`` and ``accept_pts`` change on re-INVITE.
    """

    def __init__(self, on_packet: Callable[[RtpPacket], None]) -> None:
        self.on_packet = on_packet
        self.transport: asyncio.DatagramTransport | None = None
        self.remote: tuple[str, int] | None = None
        self.accept_pts: set[int] = set()
        self.ssrc = secrets.randbits(32)
        self.seq = secrets.randbits(16)
        self.ts = secrets.randbits(32)
        self.sent = 0
        self.received = 0
        self.ignored_source = self.ignored_pt = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if self.remote is None or (addr[0], addr[1]) != self.remote:
            self.ignored_source += 1
            return
        pkt = parse_rtp(data)
        if pkt is None or pkt.pt not in self.accept_pts:
            self.ignored_pt += 1
            return
        self.received += 1
        self.on_packet(pkt)

    def error_received(self, exc) -> None:  # ICMP port unreachable etc.: the caller may be gone
        log.debug("rtp socket error: %s", exc)

    def send_frame(self, pt: int, payload: bytes) -> None:
        """One 20 ms frame to ``remote`` (nothing when there is no remote yet)."""
        if self.transport is None or self.remote is None:
            return
        self.transport.sendto(
            build_rtp(pt, self.seq, self.ts, self.ssrc, payload, self.sent == 0), self.remote
        )
        self.seq = (self.seq + 1) & 0xFFFF
        self.ts = (self.ts + len(payload)) & 0xFFFFFFFF
        self.sent += 1

    def skip(self, samples: int) -> None:
        """Advance the RTP clock without sending (on hold), so timestamps keep real time."""
        self.ts = (self.ts + samples) & 0xFFFFFFFF

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
