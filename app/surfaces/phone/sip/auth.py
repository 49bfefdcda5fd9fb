"""Who may call: HTTP digest authentication (RFC 3261 §22, RFC 2617, RFC 8760 MD5) and a source allow-list.

Policy (:meth:`Gate.check`): a source address in ``allow`` is admitted as is. Otherwise, with ``users`` set,
the INVITE must carry a valid ``Authorization`` (else 401 with a ``WWW-Authenticate`` challenge); with no
users but an allow-list, other sources get 403; with neither, everyone is admitted.

Digest (MD5, ``qop=auth`` offered, the RFC 2069 form without qop accepted): ``HA1 = MD5(user:realm:pass)``,
``HA2 = MD5(method:uri)``, ``response = MD5(HA1:nonce:nc:cnonce:qop:HA2)`` (or ``MD5(HA1:nonce:HA2)``).
Nonces are stateless: ``<unix time>.<HMAC-SHA256(secret, time)[:16]>``, valid ``nonce_ttl_s``; an expired
but authentic nonce gets a fresh challenge with ``stale=true``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

_PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')


def md5(s: str) -> str:
    return hashlib.md5(s.encode()).hexdigest()


def parse_digest(header: str) -> dict[str, str]:
    """``Digest username="a", realm="r", …`` → ``{"username": "a", "realm": "r", …}`` ({} if not Digest)."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "digest":
        return {}
    return {k.lower(): q if q or v == "" else v for k, q, v in _PARAM.findall(rest)}


def digest_response(
    user: str,
    realm: str,
    password: str,
    method: str,
    uri: str,
    nonce: str,
    qop: str = "",
    nc: str = "",
    cnonce: str = "",
) -> str:
    """The client's ``response`` value for these parameters (RFC 2617 §3.2.2.1)."""
    ha1, ha2 = md5(f"{user}:{realm}:{password}"), md5(f"{method}:{uri}")
    return md5(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}") if qop else md5(f"{ha1}:{nonce}:{ha2}")


@dataclass
class Verdict:
    """``status`` 0 = admitted; else the response code (401 with ``challenge`` / 403) and why."""

    status: int
    reason: str = ""
    challenge: str = ""


class Gate:
    """Admission of INVITEs by source address and digest credentials (module docstring)."""

    def __init__(
        self, users: dict[str, str], allow: list[str], realm: str, nonce_ttl_s: float = 300.0, clock=time.time
    ) -> None:
        self.users, self.allow, self.realm = dict(users), set(allow), realm
        self.ttl, self.clock = nonce_ttl_s, clock
        self.secret = secrets.token_bytes(16)

    def nonce(self) -> str:
        t = str(int(self.clock()))
        return f"{t}.{hmac.new(self.secret, t.encode(), hashlib.sha256).hexdigest()[:16]}"

    def _nonce_state(self, nonce: str) -> str:
        t, _, mac = nonce.partition(".")
        good = hmac.new(self.secret, t.encode(), hashlib.sha256).hexdigest()[:16]
        if not t.isdigit() or not hmac.compare_digest(mac, good):
            return "forged"
        return "stale" if self.clock() - int(t) > self.ttl else "fresh"

    def challenge(self, stale: bool = False) -> str:
        s = f'Digest realm="{self.realm}", nonce="{self.nonce()}", algorithm=MD5, qop="auth"'
        return s + (", stale=true" if stale else "")

    def check(self, source_ip: str, method: str, authorization: str | None) -> Verdict:
        """Admit or refuse one request from ``source_ip`` carrying ``authorization`` (or ``None``)."""
        if source_ip in self.allow or (not self.users and not self.allow):
            return Verdict(0)
        if not self.users:
            return Verdict(403, f"source {source_ip} is not on the allow-list")
        p = parse_digest(authorization or "")
        if not p:
            return Verdict(401, "credentials required", self.challenge())
        user, nonce = p.get("username", ""), p.get("nonce", "")
        if user not in self.users or p.get("realm") != self.realm:
            return Verdict(403, f"unknown user {user!r} or realm")
        if p.get("algorithm", "MD5").upper() != "MD5":
            return Verdict(401, "only MD5 digests", self.challenge())
        state = self._nonce_state(nonce)
        if state != "fresh":
            return Verdict(401, f"{state} nonce", self.challenge(stale=state == "stale"))
        qop = p.get("qop", "")
        if qop not in ("", "auth"):
            return Verdict(401, f"qop {qop!r} not offered", self.challenge())
        want = digest_response(
            user,
            self.realm,
            self.users[user],
            method,
            p.get("uri", ""),
            nonce,
            qop,
            p.get("nc", ""),
            p.get("cnonce", ""),
        )
        if not hmac.compare_digest(want, p.get("response", "")):
            return Verdict(403, f"wrong password for {user!r}")
        return Verdict(0)
