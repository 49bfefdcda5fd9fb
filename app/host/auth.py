"""Authentication and limits at the edge of ``omniduplex serve``: one ASGI middleware in front of every route.

* **API keys**: ``Authorization: Bearer <key>`` (the OpenAI SDKs send this), from ``--api-key``, the
  ``OMNIDUPLEX_API_KEYS`` environment variable (comma-separated) or a keys file (one per line, ``#``
  comments). Browsers cannot set headers on a WebSocket: they may pass the key or token as
  ``?token=`` or as the ``openai-insecure-api-key.<key>`` WebSocket subprotocol (the Realtime API's
  browser convention).
* **Short-lived tokens** for pages and browsers: ``ek_…`` values minted by the authenticated
  ``POST /v1/realtime/client_secrets`` (and ``POST /session-token``), accepted until they expire.
* With no keys configured, nothing is checked: the loopback demo stays key-free. Binding a non-loopback
  address without keys is refused unless ``--insecure`` (:func:`check_bind`).
* Which paths need what is declared by whoever serves them, as :class:`Access` rows: each surface next to its
  routes (``ACCESS`` / ``access(cfg)`` in ``app/surfaces/*/routes.py``), the server's own in
  :data:`SERVER_ACCESS`; the longest matching prefix decides. Open without a key: the static pages and
  assets (no row), ``public`` rows (``/healthz``, ``/readyz``), ``signed`` rows whose route checks its own
  signature (the Twilio webhooks: ``X-Twilio-Signature`` when ``TWILIO_AUTH_TOKEN`` is set; refused when keys
  are required and it is not set).
* **Limits**: request bodies over ``max_body_bytes`` → 413; new connections (``/offer``, WebSockets) per
  client address per minute over ``connections_per_minute`` → 429 (a WebSocket is refused with HTTP 403
  before the upgrade, the ASGI way); sessions per key over ``sessions_per_key`` → 429. WebSocket message
  size is uvicorn's ``ws_max_size``; seconds of audio per turn are the session's ``max_turn_ms``.

Statuses: 401 no or malformed credentials, 403 a key or token that is wrong or expired.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs

SUBPROTOCOL_KEY = "openai-insecure-api-key."


@dataclass(frozen=True)
class Access:
    """What the edge asks of requests under ``prefix``, declared by the surface (or server) serving them.

    Attributes:
        prefix: a path prefix (the longest declared prefix of a path decides its ``kind``).
        kind: ``"key"`` an API key or token when keys are configured; ``"public"`` none; ``"signed"`` none at
            the edge, the route checks its own signature.
        connection: a request here opens a session (counted by the per-address connection rate limit).
        unsigned: for ``"signed"``: why the path is refused while API keys are required (the surface has
            no signing secret); ``None``: it has one.
    """

    prefix: str
    kind: Literal["key", "public", "signed"] = "key"
    connection: bool = False
    unsigned: str | None = None


SERVER_ACCESS = (
    Access("/healthz", "public"),
    Access("/readyz", "public"),
    Access("/v1/"),  # the API namespace: a path no surface declares still needs a key
    Access("/metrics"),
    Access("/stats"),
    Access("/session-token"),
)
"""The server's own paths (:mod:`omniduplex.app.server`)."""


class AuthConfigError(ValueError):
    """A configuration that would expose the server without authentication, or an unreadable keys file."""


@dataclass
class AuthConfig:
    """Who may use the server and how much.

    Attributes:
        api_keys: accepted API keys (empty = authentication off).
        max_body_bytes: largest HTTP request body (bytes; the 25 MiB transcription upload limit).
        connections_per_minute: new session connections per client address per minute (0 = no limit).
        sessions_per_key: concurrent sessions per API key or token (0 = no limit).
        token_ttl_s: lifetime of a ``/session-token`` token (s).
    """

    api_keys: set[str] = field(default_factory=set)
    max_body_bytes: int = 26 << 20
    connections_per_minute: int = 60
    sessions_per_key: int = 0
    token_ttl_s: int = 600

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys)


def load_keys(cli_keys: list[str] | None = None, keys_file: str | Path | None = None) -> set[str]:
    """API keys from the command line, ``$OMNIDUPLEX_API_KEYS`` (comma-separated) and a keys file.

    Raises:
        AuthConfigError: the keys file cannot be read.
    """
    keys = {k.strip() for k in (cli_keys or []) if k.strip()}
    keys |= {k.strip() for k in os.environ.get("OMNIDUPLEX_API_KEYS", "").split(",") if k.strip()}
    if keys_file:
        try:
            lines = Path(keys_file).read_text().splitlines()
        except OSError as e:
            raise AuthConfigError(f"cannot read API keys file {keys_file}: {e}") from e
        keys |= {ln.split("#", 1)[0].strip() for ln in lines} - {""}
    return keys


def check_bind(host: str, cfg: AuthConfig, insecure: bool) -> None:
    """Refuse to listen beyond loopback without keys.

    Raises:
        AuthConfigError: ``host`` is not a loopback address, no key is configured, and not ``insecure``.
    """
    if cfg.enabled or insecure:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise AuthConfigError(
            f"refusing to listen on {host} without API keys: pass --api-key (or $OMNIDUPLEX_API_KEYS, "
            "--api-keys-file), or --insecure to expose it unauthenticated"
        )


class TokenStore:
    """Short-lived ``ek_…`` tokens (value → expiry, unix seconds), pruned as they expire."""

    def __init__(self) -> None:
        self.tokens: dict[str, float] = {}

    def mint(self, ttl_s: float) -> tuple[str, int]:
        """A new token valid for ``ttl_s`` seconds; returns ``(value, expires_at)``."""
        value, expires = f"ek_{secrets.token_urlsafe(24)}", time.time() + ttl_s
        self.tokens[value] = expires
        self.prune()
        return value, int(expires)

    def valid(self, value: str) -> bool:
        expiry = self.tokens.get(value)
        return expiry is not None and expiry > time.time()

    def prune(self) -> None:
        now = time.time()
        for k in [k for k, t in self.tokens.items() if t <= now]:
            del self.tokens[k]


def _credential(scope) -> str | None:
    """The key or token a request carries: bearer header, ``?token=``, or the browser subprotocol."""
    headers = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    q = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    if q.get("token"):
        return q["token"][0]
    for proto in scope.get("subprotocols") or []:
        if proto.startswith(SUBPROTOCOL_KEY):
            return proto[len(SUBPROTOCOL_KEY) :]
    return None


class EdgeGate:
    """ASGI middleware: authentication, body size, connection rate and per-key session limits.

    Args:
        app: the wrapped ASGI app.
        cfg: keys and limits.
        tokens: the server's short-lived tokens.
        access: the declared paths (the surfaces' and :data:`SERVER_ACCESS`); a path none declares is a
            static page or asset, open.
        clock: monotonic seconds (rate-limit windows).
    """

    def __init__(
        self,
        app,
        cfg: AuthConfig,
        tokens: TokenStore,
        access: Sequence[Access] = SERVER_ACCESS,
        clock=time.monotonic,
    ) -> None:
        self.app, self.cfg, self.tokens, self.clock = app, cfg, tokens, clock
        self.access = sorted(access, key=lambda a: -len(a.prefix))  # the longest prefix first
        self.connection_prefixes = tuple(a.prefix for a in access if a.connection)
        self.recent: dict[str, deque[float]] = defaultdict(deque)  # client address → connection times
        self.sessions: dict[str, int] = defaultdict(int)  # credential → open WebSocket sessions

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path, ws = scope["path"], scope["type"] == "websocket"
        cred = _credential(scope)
        denied = self._authenticate(path, cred)
        if denied:
            return await self._deny(scope, receive, send, *denied)
        if not ws:
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.cfg.max_body_bytes:
                return await self._deny(
                    scope, receive, send, 413, f"body over {self.cfg.max_body_bytes} bytes"
                )
        if path.startswith(self.connection_prefixes) and not self._admit_connection(scope):
            limit = self.cfg.connections_per_minute
            return await self._deny(scope, receive, send, 429, f"over {limit} new connections per minute")
        if ws and cred and self.cfg.sessions_per_key:
            if self.sessions[cred] >= self.cfg.sessions_per_key:
                limit = self.cfg.sessions_per_key
                return await self._deny(scope, receive, send, 429, f"over {limit} sessions for this key")
            self.sessions[cred] += 1
            try:
                return await self.app(scope, receive, send)
            finally:
                self.sessions[cred] -= 1
        return await self.app(scope, receive, send)

    def _authenticate(self, path: str, cred: str | None) -> tuple[int, str] | None:
        if not self.cfg.enabled:
            return None
        rule = next((a for a in self.access if path.startswith(a.prefix)), None)
        if rule is not None and rule.kind == "signed" and rule.unsigned:
            return 403, rule.unsigned
        if rule is None or rule.kind != "key":
            return None
        if not cred:
            return 401, "missing API key: send 'Authorization: Bearer <key>' (or ?token=)"
        if cred in self.cfg.api_keys or (cred.startswith("ek_") and self.tokens.valid(cred)):
            return None
        return 403, "invalid or expired API key or token"

    def _admit_connection(self, scope) -> bool:
        limit = self.cfg.connections_per_minute
        if not limit:
            return True
        addr = (scope.get("client") or ("?", 0))[0]
        now, q = self.clock(), self.recent[addr]
        while q and q[0] <= now - 60.0:
            q.popleft()
        if len(q) >= limit:
            return False
        q.append(now)
        return True

    @staticmethod
    async def _deny(scope, receive, send, status: int, message: str) -> None:
        if scope["type"] == "websocket":  # closing before accept: the client sees HTTP 403
            await send({"type": "websocket.close", "code": 1008, "reason": f"{status}: {message}"[:120]})
            return
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": status}})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})
