"""SDP offer/answer for one audio stream (RFC 4566 syntax, RFC 3264 offer/answer, RFC 3551 payload types).

We answer the first ``m=audio`` line over ``RTP/AVP`` whose port is not 0 with one G.711 codec (the
offerer's first of PCMU/0, PCMA/8: RFC 3264 §6.1, answerer picks from the offer, keeping its order) plus
``telephone-event/8000`` (RFC 4733) when offered; every other ``m=`` line is rejected with port 0, as §6
requires. Direction (§6.1, §8.4 hold): the answer mirrors the offer — ``sendonly`` → ``recvonly``,
``recvonly`` → ``sendonly``, ``inactive`` → ``inactive``; a ``c=`` of ``0.0.0.0`` (RFC 2543 hold) counts as
``sendonly`` from the offerer. ``ptime`` is answered as 20 ms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATIC = {0: ("PCMU", 8000), 8: ("PCMA", 8000)}
"""RFC 3551 static payload types we speak."""
SUPPORTED = ("PCMU", "PCMA")
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_MIRROR = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive"}


class SdpError(ValueError):
    """The offer cannot be answered; ``status``: 400 (unparseable) or 488 (nothing acceptable), and
    ``warning`` the RFC 3261 §20.43 warn-code (304 media type / 305 incompatible format / 399 misc)."""

    def __init__(self, reason: str, status: int = 488, warning: int = 399) -> None:
        super().__init__(reason)
        self.reason, self.status, self.warning = reason, status, warning


@dataclass
class Media:
    """One ``m=`` line: ``media`` (audio/video/…), ``port``, ``proto``, payload ``formats`` and attributes."""

    media: str
    port: int
    proto: str
    formats: list[str]
    rtpmap: dict[int, tuple[str, int]] = field(default_factory=dict)  # pt → (encoding, clock rate)
    direction: str | None = None
    connection: str | None = None


@dataclass
class Offer:
    """A parsed session description: session-level ``c=`` address and direction, and its media."""

    connection: str | None
    direction: str
    media: list[Media]


@dataclass
class Negotiated:
    """The agreed audio stream: ``codec`` / ``pt``, ``dtmf_pt`` (``None`` when not offered), where to send
    (``remote``), and ``direction`` from OUR side (``sendrecv``, ``sendonly``, ``recvonly``, ``inactive``)."""

    codec: str
    pt: int
    dtmf_pt: int | None
    remote: tuple[str, int]
    direction: str
    index: int  # which m= line
    offer: Offer

    @property
    def we_send(self) -> bool:
        return self.direction in ("sendrecv", "sendonly")

    @property
    def we_receive(self) -> bool:
        return self.direction in ("sendrecv", "recvonly")


def parse(text: str) -> Offer:
    """Parse an SDP body.

    Raises:
        SdpError: 400 when it is not SDP (no ``v=0``, a bad ``m=`` or ``c=`` line).
    """
    lines = [ln.strip() for ln in text.replace("\r\n", "\n").split("\n") if ln.strip()]
    if not lines or lines[0] != "v=0":
        raise SdpError("SDP must start with v=0", 400)
    conn, direction, media = None, "sendrecv", []
    for ln in lines[1:]:
        if len(ln) < 2 or ln[1] != "=":
            raise SdpError(f"bad SDP line {ln[:60]!r}", 400)
        kind, value = ln[0], ln[2:]
        if kind == "m":
            parts = value.split()
            if len(parts) < 4 or not parts[1].split("/")[0].isdigit():
                raise SdpError(f"bad m= line {ln!r}", 400)
            media.append(Media(parts[0], int(parts[1].split("/")[0]), parts[2], parts[3:]))
        elif kind == "c":
            parts = value.split()
            if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
                raise SdpError(f"bad c= line {ln!r}", 400)
            addr = parts[2].split("/")[0]
            if media:
                media[-1].connection = addr
            else:
                conn = addr
        elif kind == "a":
            name, _, arg = value.partition(":")
            if name in DIRECTIONS:
                if media:
                    media[-1].direction = name
                else:
                    direction = name
            elif name == "rtpmap" and media:
                pt, _, enc = arg.partition(" ")
                codec = enc.split("/")
                if pt.isdigit() and len(codec) >= 2 and codec[1].isdigit():
                    media[-1].rtpmap[int(pt)] = (codec[0], int(codec[1]))
    return Offer(conn, direction, media)


def negotiate(offer: Offer) -> Negotiated:
    """Choose the audio stream, codec and direction of the answer (module docstring).

    Raises:
        SdpError: 488 when no ``m=audio`` RTP/AVP stream offers PCMU or PCMA.
    """
    reasons = []
    for i, m in enumerate(offer.media):
        if m.media != "audio" or m.port == 0:
            continue
        if m.proto.upper() != "RTP/AVP":
            reasons.append(f"transport {m.proto} (only RTP/AVP)")
            continue
        codecs = {}
        for f in m.formats:
            if not f.isdigit():
                continue
            pt = int(f)
            name, rate = m.rtpmap.get(pt) or STATIC.get(pt, ("", 0))
            codecs.setdefault(pt, (name.upper(), rate))
        chosen = next(((pt, n) for pt, (n, r) in codecs.items() if n in SUPPORTED and r == 8000), None)
        if chosen is None:
            reasons.append("codecs " + ", ".join(f"{n or '?'}/{r}" for n, r in codecs.values()))
            continue
        dtmf = next((pt for pt, (n, r) in codecs.items() if n == "TELEPHONE-EVENT" and r == 8000), None)
        addr = m.connection or offer.connection
        if addr is None:
            raise SdpError("no c= connection address", 400)
        offered = m.direction or offer.direction
        if addr in ("0.0.0.0", "::"):
            offered = (
                "sendonly" if offered == "sendrecv" else "inactive" if offered == "recvonly" else offered
            )
        return Negotiated(chosen[1], chosen[0], dtmf, (addr, m.port), _MIRROR[offered], i, offer)
    warning = 305 if reasons else 304
    raise SdpError("no acceptable audio stream: " + ("; ".join(reasons) or "no m=audio line"), 488, warning)


def answer(neg: Negotiated, address: str, port: int, session_id: int, version: int) -> str:
    """The answer SDP: our ``address``/``port`` for the chosen stream, port 0 for every other ``m=`` line."""
    ip = "IP6" if ":" in address else "IP4"
    lines = [
        "v=0",
        f"o=omniduplex {session_id} {version} IN {ip} {address}",
        "s=omniduplex",
        f"c=IN {ip} {address}",
        "t=0 0",
    ]
    for i, m in enumerate(neg.offer.media):
        if i != neg.index:
            lines.append(f"m={m.media} 0 {m.proto} {' '.join(m.formats)}")
            continue
        fmts = [str(neg.pt)] + ([str(neg.dtmf_pt)] if neg.dtmf_pt is not None else [])
        lines.append(f"m=audio {port} RTP/AVP {' '.join(fmts)}")
        lines.append(f"a=rtpmap:{neg.pt} {neg.codec}/8000")
        if neg.dtmf_pt is not None:
            lines += [f"a=rtpmap:{neg.dtmf_pt} telephone-event/8000", f"a=fmtp:{neg.dtmf_pt} 0-16"]
        lines += ["a=ptime:20", f"a={neg.direction}"]
    return "\r\n".join(lines) + "\r\n"
