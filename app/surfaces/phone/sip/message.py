"""SIP messages (RFC 3261 §7, §20): parse one request or response, frame a TCP byte stream, build responses.

* Start line ``METHOD URI SIP/2.0`` or ``SIP/2.0 CODE REASON``; header lines ``Name: value``, folded lines
  (leading whitespace) joined (§7.3.1); compact names expanded (§7.3.3: ``v i f t m l c k s e``).
* Header names are case-insensitive; they are kept in order, with every occurrence (Via may repeat).
* Body length: ``Content-Length`` (§20.14). Over UDP a missing one means "the rest of the datagram", a
  larger one than the datagram is an error (400, §18.3), extra bytes are dropped. Over TCP it is mandatory
  and delimits the message (:class:`StreamFramer`).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

MAX_MESSAGE = 65535
"""Largest message accepted (bytes): a UDP datagram's limit, also applied to TCP."""
COMPACT = {
    "v": "via",
    "i": "call-id",
    "f": "from",
    "t": "to",
    "m": "contact",
    "l": "content-length",
    "c": "content-type",
    "k": "supported",
    "s": "subject",
    "e": "content-encoding",
}
CANONICAL = {"call-id": "Call-ID", "cseq": "CSeq", "www-authenticate": "WWW-Authenticate", "via": "Via"}
REQUIRED = ("via", "from", "to", "call-id", "cseq")
"""Headers every request must carry (RFC 3261 §8.1.1); a request without one is answered 400."""
_BRANCH = re.compile(r";\s*branch=([^;,\s]+)", re.I)
_TAG = re.compile(r";\s*tag=([^;,\s>]+)", re.I)


class SipParseError(ValueError):
    """A message we cannot parse; ``status`` is the response to answer a request with (400 by default)."""

    def __init__(self, reason: str, status: int = 400, message: SipMessage | None = None) -> None:
        super().__init__(reason)
        self.reason, self.status = reason, status
        self.message = message  # the headers, when they parsed (so the error response can copy Via …)


def canonical(name: str) -> str:
    """``call-id`` → ``Call-ID``, ``v`` → ``Via``, ``content-type`` → ``Content-Type``."""
    n = name.strip().lower()
    n = COMPACT.get(n, n)
    return CANONICAL.get(n) or "-".join(p.capitalize() for p in n.split("-"))


@dataclass
class SipMessage:
    """A parsed request (``method``, ``uri``) or response (``status``, ``reason``)."""

    method: str | None = None
    uri: str = ""
    status: int | None = None
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.method is not None

    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (any case or compact form), or ``None``."""
        key = canonical(name)
        return next((v for k, v in self.headers if k == key), None)

    def get_all(self, name: str) -> list[str]:
        key = canonical(name)
        return [v for k, v in self.headers if k == key]

    @property
    def call_id(self) -> str:
        return self.get("Call-ID") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        """``(number, method)`` of the CSeq header.

        Raises:
            SipParseError: missing or malformed CSeq.
        """
        num, _, method = (self.get("CSeq") or "").strip().partition(" ")
        if not num.isdigit() or not method.strip():
            raise SipParseError(f"bad CSeq {self.get('CSeq')!r}")
        return int(num), method.strip().upper()

    @property
    def branch(self) -> str:
        """The top Via's ``branch`` parameter ("" without one): names the transaction (§17.2.3)."""
        m = _BRANCH.search(self.get("Via") or "")
        return m.group(1) if m else ""

    def tag(self, header: str) -> str:
        """The ``tag`` parameter of ``From`` or ``To`` ("" without one)."""
        m = _TAG.search(self.get(header) or "")
        return m.group(1) if m else ""


def _parse_head(head: str) -> SipMessage:
    lines = head.split("\r\n") if "\r\n" in head else head.split("\n")
    start = lines[0].strip()
    parts = start.split(" ", 2)
    if len(parts) == 3 and parts[0] == "SIP/2.0":
        if not (parts[1].isdigit() and len(parts[1]) == 3):
            raise SipParseError(f"bad status line {start!r}")
        msg = SipMessage(status=int(parts[1]), reason=parts[2])
    elif len(parts) == 3 and parts[2] == "SIP/2.0" and re.fullmatch(r"[A-Za-z]+", parts[0]):
        msg = SipMessage(method=parts[0].upper(), uri=parts[1])
    else:
        raise SipParseError(f"bad start line {start[:80]!r}")
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t" and msg.headers:  # folded continuation (§7.3.1)
            k, v = msg.headers[-1]
            msg.headers[-1] = (k, f"{v} {line.strip()}")
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or " " in name.strip():
            raise SipParseError(f"bad header line {line[:80]!r}")
        msg.headers.append((canonical(name), value.strip()))
    return msg


def _content_length(msg: SipMessage) -> int | None:
    values = msg.get_all("Content-Length")
    if not values:
        return None
    if len(set(values)) > 1 or not values[0].isdigit():
        raise SipParseError(f"bad Content-Length {values!r}")
    return int(values[0])


def _split(data: bytes) -> tuple[bytes, bytes]:
    for sep in (b"\r\n\r\n", b"\n\n"):
        i = data.find(sep)
        if i >= 0:
            return data[:i], data[i + len(sep) :]
    return data, b""


def parse(datagram: bytes) -> SipMessage:
    """One whole message (a UDP datagram).

    Raises:
        SipParseError: not SIP, a bad header line, or a bad ``Content-Length``.
    """
    if len(datagram) > MAX_MESSAGE:
        raise SipParseError("message too large", 513)
    head, body = _split(datagram.lstrip(b"\r\n"))
    try:
        msg = _parse_head(head.decode("utf-8"))
    except UnicodeDecodeError:
        raise SipParseError("header is not UTF-8") from None
    try:
        n = _content_length(msg)
    except SipParseError as e:
        raise SipParseError(e.reason, e.status, msg) from None
    if n is not None and n > len(body):
        raise SipParseError(f"Content-Length {n} exceeds the {len(body)} body bytes received", 400, msg)
    msg.body = body if n is None else body[:n]
    return msg


class StreamFramer:
    """Splits a TCP byte stream into messages by ``Content-Length`` (RFC 3261 §18.3).

    ``feed(data)`` returns the complete messages (as bytes) now available. A message whose
    header is unparseable or lacks a valid ``Content-Length`` loses the framing: :class:`SipParseError`
    is raised and the connection should be closed.
    """

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        out = []
        while True:
            self.buf = self.buf.lstrip(b"\r\n")  # keep-alive CRLFs (RFC 5626 §3.5.1)
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                if len(self.buf) > MAX_MESSAGE:
                    raise SipParseError("header too large", 513)
                return out
            head = _parse_head(self.buf[:i].decode("utf-8", "replace"))
            n = _content_length(head)
            if n is None:
                raise SipParseError("Content-Length is mandatory over TCP")
            end = i + 4 + n
            if end > MAX_MESSAGE:
                raise SipParseError("message too large", 513)
            if len(self.buf) < end:
                return out
            out.append(self.buf[:end])
            self.buf = self.buf[end:]


REASONS = {
    100: "Trying",
    180: "Ringing",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    405: "Method Not Allowed",
    408: "Request Timeout",
    415: "Unsupported Media Type",
    420: "Bad Extension",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    500: "Server Internal Error",
    503: "Service Unavailable",
    513: "Message Too Large",
}


def new_tag() -> str:
    """A fresh ``tag`` / Call-ID token (RFC 3261 §19.3: at least 32 bits of randomness)."""
    return secrets.token_hex(6)


def new_branch() -> str:
    """A fresh Via branch with the RFC 3261 magic cookie ``z9hG4bK`` (§8.1.1.7)."""
    return "z9hG4bK" + secrets.token_hex(8)


def response(
    req: SipMessage,
    status: int,
    to_tag: str = "",
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    content_type: str = "application/sdp",
) -> bytes:
    """The response to ``req`` (§8.2.6): Via (all of them, in order), From, Call-ID and CSeq copied; To
    copied with ``to_tag`` added unless it has one (never on 100, §8.2.6.2); extra ``headers``."""
    lines = [f"SIP/2.0 {status} {REASONS.get(status, 'Unknown')}"]
    lines += [f"Via: {v}" for v in req.get_all("Via")]
    to = req.get("To") or ""
    if to_tag and status != 100 and not req.tag("To"):
        to = f"{to};tag={to_tag}"
    for name, value in (
        ("From", req.get("From")),
        ("To", to),
        ("Call-ID", req.get("Call-ID")),
        ("CSeq", req.get("CSeq")),
    ):
        if value:
            lines.append(f"{name}: {value}")
    lines += [f"{k}: {v}" for k, v in headers or []]
    lines.append("Server: omniduplex")
    if body:
        lines.append(f"Content-Type: {content_type}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def request(method: str, uri: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    """A request we originate (in-dialog BYE): start line, ``headers`` in order, Content-Length."""
    lines = [
        f"{method} {uri} SIP/2.0",
        *(f"{k}: {v}" for k, v in headers),
        "Max-Forwards: 70",
        "User-Agent: omniduplex",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def uri_of(name_addr: str) -> str:
    """The URI inside a From/To/Contact value: ``"Bob" <sip:bob@h>;tag=1`` → ``sip:bob@h``."""
    m = re.search(r"<([^>]*)>", name_addr)
    return (m.group(1) if m else name_addr.split(";")[0]).strip()
