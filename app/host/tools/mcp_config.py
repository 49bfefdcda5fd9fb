"""What the operator declares about MCP servers (``serve --mcp``, ``--mcp-allow-url``):
:class:`MCPServerSpec` and :class:`MCPConfig` (re-exported by :mod:`.mcp_client`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MCPServerSpec:
    """One MCP server the operator declares.

    Exactly one of ``command`` (argv of a stdio server, started as a child process) or ``url`` (a
    streamable-HTTP endpoint, e.g. ``http://127.0.0.1:9000/mcp``). ``headers``: sent with every HTTP request
    (auth tokens). ``allowed_tools``: the only tool names offered and callable (``None``: all the server
    lists). ``timeout_s``: the longest a call may take before it fails as timed out. ``env``: extra
    environment variables for a stdio server.

    Raises:
        ValueError: neither or both of ``command`` / ``url``; a URL that is not http(s).
    """

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    allowed_tools: tuple[str, ...] | None = None
    timeout_s: float = 10.0
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of a stdio command or a URL")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must be http(s)://, got {self.url!r}")
        if self.command is not None and not self.command:
            raise ValueError(f"MCP server {self.name!r}: empty command")

    @classmethod
    def parse(cls, text: str, *, timeout_s: float = 10.0) -> MCPServerSpec:
        """``NAME=URL`` or ``NAME=COMMAND ARGS...`` (shell-quoted), as given to ``serve --mcp``.

        A ``[tool1,tool2]`` suffix on NAME restricts the tools: ``orders[order_status]=http://...``.

        Raises:
            ValueError: no ``=``, an empty name or target.
        """
        name, sep, target = text.partition("=")
        name, target = name.strip(), target.strip()
        if not sep or not name or not target:
            raise ValueError(f"--mcp expects NAME=URL or NAME=COMMAND, got {text!r}")
        allowed = None
        if name.endswith("]") and "[" in name:
            name, _, rest = name[:-1].partition("[")
            allowed = tuple(t.strip() for t in rest.split(",") if t.strip())
        if target.startswith(("http://", "https://")):
            return cls(name=name, url=target, allowed_tools=allowed, timeout_s=timeout_s)
        return cls(name=name, command=tuple(shlex.split(target)), allowed_tools=allowed, timeout_s=timeout_s)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MCPServerSpec:
        """From a config mapping: ``{name, command | url, headers?, allowed_tools?, timeout_s?, env?}``
        (``command`` a list or a shell-quoted string).

        Raises:
            ValueError: as :class:`MCPServerSpec`; an unknown key.
        """
        known = {"name", "command", "url", "headers", "allowed_tools", "timeout_s", "env"}
        extra = set(d) - known
        if extra:
            raise ValueError(f"MCP server config: unknown keys {sorted(extra)}")
        command = d.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        allowed = d.get("allowed_tools")
        return cls(
            name=str(d.get("name") or d.get("url") or "mcp"),
            command=tuple(command) if command is not None else None,
            url=d.get("url"),
            headers=tuple(sorted((d.get("headers") or {}).items())),
            allowed_tools=tuple(allowed) if allowed is not None else None,
            timeout_s=float(d.get("timeout_s", 10.0)),
            env=tuple(sorted((d.get("env") or {}).items())),
        )


@dataclass
class MCPConfig:
    """The serve configuration's tools section: ``servers`` used by the voice surfaces' server-side tool
    runner; ``allow_urls``: URL prefixes a client may name as an MCP ``server_url`` (Realtime ``type:
    "mcp"``); empty (the default) refuses every client-supplied URL."""

    servers: list[MCPServerSpec] = field(default_factory=list)
    allow_urls: list[str] = field(default_factory=list)

    def url_allowed(self, url: str) -> bool:
        """True iff ``url`` starts with an allow-listed prefix (compared without a trailing ``/``)."""
        u = url.rstrip("/")
        return any(u == p.rstrip("/") or u.startswith(p.rstrip("/") + "/") for p in self.allow_urls)
