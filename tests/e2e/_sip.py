"""SIP test helpers: SIPp runs (scenarios in ``sipp/``), caller audio files for its ``rtp_stream``, a
loopback packet capture of the RTP we send (AF_PACKET; root only), raw SIP messages."""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omniduplex.app.surfaces.wire.g711 import ulaw_decode, ulaw_encode

SIPP_DIR = Path(__file__).parent / "sipp"


def write_caller(path: Path, *parts: np.ndarray | float) -> Path:
    """Raw μ-law 8 kHz for SIPp's ``rtp_stream``: int16 arrays, or floats = seconds of silence."""
    pcm = [np.zeros(int(p * 8000), np.int16) if isinstance(p, float | int) else p for p in parts]
    path.write_bytes(ulaw_encode(np.concatenate(pcm)))
    return path


def sipp(
    scenario: str,
    port: int,
    cwd: Path,
    *args: str,
    transport: str = "u1",
    timeout_s: int = 60,
    background: bool = False,
):
    """Run SIPp (``scenario`` from ``sipp/``) against 127.0.0.1:``port`` in ``cwd`` (where its audio files
    are). Returns the finished ``CompletedProcess`` or, with ``background``, the ``Popen``."""
    media_port = random.randrange(40000, 50000, 2)
    cmd = [
        "sipp",
        f"127.0.0.1:{port}",
        "-sf",
        str(SIPP_DIR / scenario),
        "-i",
        "127.0.0.1",
        "-mi",
        "127.0.0.1",
        "-p",
        str(random.randrange(51000, 59000)),
        "-mp",
        str(media_port),
        "-t",
        transport,
        "-nostdin",
        "-timeout",
        f"{timeout_s}s",
        "-timeout_error",
        "-trace_err",
        *args,
    ]
    kw = dict(cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if background:
        return subprocess.Popen(cmd, **kw)
    return subprocess.run(cmd, timeout=timeout_s + 30, **kw)


def sipp_errors(cwd: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in cwd.glob("*_errors.log"))


@dataclass
class Packet:
    t: float
    src: tuple[str, int]
    dst: tuple[str, int]
    payload: bytes


class LoopbackCapture:
    """Records UDP datagrams on ``lo`` whose source port is in ``src_ports`` (a real capture of what left
    the server, after the kernel). Needs CAP_NET_RAW; :attr:`available` is False otherwise."""

    def __init__(self, src_ports: range) -> None:
        self.src_ports = src_ports
        self.packets: list[Packet] = []
        self.stop = threading.Event()
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
            self.sock.bind(("lo", 0))
            self.sock.settimeout(0.1)
            self.available = True
        except (PermissionError, OSError, AttributeError):
            self.available = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LoopbackCapture:
        if self.available:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.available:
            self.thread.join(2)
            self.sock.close()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                frame, addr = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            if addr[2] == socket.PACKET_OUTGOING:  # lo shows each packet twice: keep the receive side
                continue
            ip = frame[14:]
            if len(ip) < 28 or ip[9] != 17:  # UDP
                continue
            ihl = (ip[0] & 0x0F) * 4
            sport, dport = struct.unpack_from("!HH", ip, ihl)
            if sport in self.src_ports:
                src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
                self.packets.append(Packet(time.monotonic(), (src, sport), (dst, dport), ip[ihl + 8 :]))

    def streams(self) -> dict[tuple, list[Packet]]:
        """Packets grouped by (source, destination)."""
        out = defaultdict(list)
        for p in self.packets:
            out[(p.src, p.dst)].append(p)
        return dict(out)


def decode_stream(packets: list[Packet]) -> tuple[np.ndarray, np.ndarray]:
    """PCMU RTP packets → (int16 8 kHz audio in sequence order, arrival times per 20 ms frame)."""
    rows = []
    for p in packets:
        if len(p.payload) >= 12 and p.payload[1] & 0x7F == 0:
            rows.append((struct.unpack_from("!H", p.payload, 2)[0], p.t, p.payload[12:]))
    rows.sort(key=lambda r: r[1])
    if not rows:
        return np.zeros(0, np.int16), np.zeros(0)
    return ulaw_decode(b"".join(r[2] for r in rows)), np.array([r[1] for r in rows])


def raw_request(
    method: str,
    port: int,
    local: tuple[str, int],
    call_id: str = "raw-1",
    body: str = "",
    drop: tuple[str, ...] = (),
    extra: str = "",
    content_length: str | None = None,
    content_type: str = "application/sdp",
    cseq: str | None = None,
    from_tag: str | None = None,
    to: str | None = None,
) -> bytes:
    """A hand-built request; ``drop`` leaves headers out, ``content_length`` overrides the real one."""
    headers = {
        "Via": f"SIP/2.0/UDP {local[0]}:{local[1]};branch=z9hG4bK{os.urandom(4).hex()}",
        "From": f"<sip:raw@{local[0]}>;tag={from_tag or 'r' + os.urandom(3).hex()}",
        "To": to or f"<sip:assistant@127.0.0.1:{port}>",
        "Call-ID": call_id,
        "CSeq": cseq or f"1 {method}",
        "Contact": f"<sip:raw@{local[0]}:{local[1]}>",
        "Max-Forwards": "70",
    }
    if body:
        headers["Content-Type"] = content_type
    headers["Content-Length"] = content_length if content_length is not None else str(len(body.encode()))
    lines = [f"{method} sip:assistant@127.0.0.1:{port} SIP/2.0"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k not in drop]
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n" + body).encode()


def offer(rtp_port: int, formats: str = "0 101", extra: str = "a=rtpmap:101 telephone-event/8000\r\n") -> str:
    return (
        f"v=0\r\no=raw 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        f"m=audio {rtp_port} RTP/AVP {formats}\r\n{extra}"
    )


def status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1])


def thread_cpu_s(thread: threading.Thread) -> float:
    """CPU seconds (user + system) used so far by ``thread`` (Linux ``/proc/self/task/<tid>/stat``)."""
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
