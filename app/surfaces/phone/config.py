"""Settings of the phone surfaces: the Twilio-protocol media stream and the SIP UAS (``ServerConfig.twilio``,
``ServerConfig.sip``). Plain dataclasses, importable without the protocol code."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class TwilioConfig:
    """The media-stream bridge (``/phone/twilio/*``).

    Attributes:
        auth_token: Twilio auth token; when set, ``X-Twilio-Signature`` is required on the voice webhook and
            on the stream's WebSocket handshake (403 otherwise). Default: ``$TWILIO_AUTH_TOKEN`` or none.
        public_url: the base URL Twilio uses to reach this server (``https://example.com``), when a proxy
            rewrites scheme or host: signatures are computed over the URL Twilio requested, and the TwiML
            stream URL is built from it. ``None``: taken from the request (``Host``, ``X-Forwarded-Proto``).
        lead_ms: how far ahead of the caller's ear reply audio may be sent (Twilio buffers it) (ms).
        mark_ms: a ``mark`` follows every this much reply audio, and the end of each reply chunk (ms).
        media_timeout_s: end the call when no message arrives for this long (s).
    """

    auth_token: str | None = field(default_factory=lambda: os.environ.get("TWILIO_AUTH_TOKEN") or None)
    public_url: str | None = None
    lead_ms: int = 100
    mark_ms: int = 100
    media_timeout_s: float = 10.0


@dataclass
class SipConfig:
    """The SIP user agent server (``omniduplex serve --sip HOST:PORT``).

    Attributes:
        host, port: where SIP listens, on UDP and TCP both.
        rtp_ports: inclusive range of local UDP ports for RTP, one per call (even ports, RFC 3550 §11).
        max_calls: concurrent calls; an INVITE beyond it is answered 503.
        call_timeout_s: longest call (s); it is ended with BYE when reached.
        rtp_timeout_s: a call with no RTP for this long (while not on hold) ends with BYE (s).
        users: digest credentials ``{username: password}`` (RFC 8760 / 2617 MD5); empty = no digest.
        allow: source addresses (exact IPs) allowed to call without digest; empty = any (when no users).
        realm: digest realm.
        ring_s: 180 Ringing for this long before answering (s); 0 answers at once.
        public_host: the address written into SDP ``c=`` and ``Contact`` (default: ``host``, or the local
            address the call arrived on when ``host`` is a wildcard).
    """

    host: str = "127.0.0.1"
    port: int = 5060
    rtp_ports: tuple[int, int] = (10000, 10100)
    max_calls: int = 8
    call_timeout_s: float = 3600.0
    rtp_timeout_s: float = 10.0
    users: dict[str, str] = field(default_factory=dict)
    allow: list[str] = field(default_factory=list)
    realm: str = "omniduplex"
    ring_s: float = 0.0
    public_host: str | None = None

    @classmethod
    def parse(cls, listen: str, rtp_ports: str = "10000-10100", **kw) -> SipConfig:
        """From CLI strings: ``listen`` ``HOST:PORT``, ``rtp_ports`` ``LOW-HIGH``.

        Raises:
            ValueError: malformed address or range.
        """
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--sip must be HOST:PORT, got {listen!r}")
        lo, sep, hi = rtp_ports.partition("-")
        if not sep or not lo.isdigit() or not hi.isdigit() or not 0 < int(lo) < int(hi) < 65536:
            raise ValueError(f"--rtp-ports must be LOW-HIGH with LOW < HIGH, got {rtp_ports!r}")
        return cls(host=host.strip("[]"), port=int(port), rtp_ports=(int(lo), int(hi)), **kw)
