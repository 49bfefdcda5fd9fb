"""SIP transports (RFC 3261 §18): UDP datagrams and TCP byte streams in, one whole message per callback.

Every message reaches ``on_data(bytes, Peer)``; the :class:`Peer` says where it came from and answers it
the way it came (a datagram back to the source address, or a write on the same TCP connection).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from omniduplex.app.surfaces.phone.sip import message as sipmsg

log = logging.getLogger("omniduplex.phone.sip")


@dataclass
class Peer:
    """Where a message came from and how to answer: ``transport`` "UDP"/"TCP", remote ``addr``, the
    local address it arrived on, and :meth:`send` (datagram to ``addr`` / write on the connection)."""

    transport: str
    addr: tuple[str, int]
    local: tuple[str, int]
    writer: object  # asyncio.DatagramTransport (UDP) or asyncio.StreamWriter (TCP)

    def send(self, data: bytes) -> None:
        if self.transport == "UDP":
            self.writer.sendto(data, self.addr)
        elif not self.writer.is_closing():
            self.writer.write(data)


OnData = Callable[[bytes, Peer], None]


class UdpTransport(asyncio.DatagramProtocol):
    """The SIP UDP socket: each datagram is one message."""

    def __init__(self, on_data: OnData) -> None:
        self.on_data = on_data

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        local = self.transport.get_extra_info("sockname")
        self.on_data(data, Peer("UDP", (addr[0], addr[1]), (local[0], local[1]), self.transport))


def tcp_connection(on_data: OnData, on_malformed: Callable[[], None]):
    """An ``asyncio.start_server`` handler: frames the stream by Content-Length (:class:`StreamFramer`);
    a message that breaks the framing is answered 400 and the connection closed (nothing after it can be
    trusted); the connection's other calls keep their dialogs."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        addr, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        peer = Peer("TCP", (addr[0], addr[1]), (local[0], local[1]), writer)
        framer = sipmsg.StreamFramer()
        try:
            while data := await reader.read(65536):
                for raw in framer.feed(data):
                    on_data(raw, peer)
        except sipmsg.SipParseError as e:
            on_malformed()
            log.warning("SIP/TCP from %s: %s; closing the connection", addr, e.reason)
            writer.write(f"SIP/2.0 400 {e.reason}\r\nContent-Length: 0\r\n\r\n".encode())
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return handle
