"""What the host needs to run (``ServerConfig`` in :mod:`omniduplex.app.server` adds the surfaces' own
settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omniduplex.app.core.session import SessionConfig
from omniduplex.app.host.auth import AuthConfig
from omniduplex.app.host.tools.mcp_config import MCPConfig, MCPServerSpec


@dataclass
class ToolsConfig:
    """Server-side tools (:mod:`.tools`): ``mcp``: the declared MCP servers and the URL allow-list for
    client-supplied ``server_url`` s; ``max_calls``: calls per user turn before the loop is cut;
    ``filler_after_s``: a call slower than this gets a spoken filler (``0``: never); ``timeout_s``: a call's
    longest wait (``None``: each server's own)."""

    mcp: MCPConfig = field(default_factory=MCPConfig)
    max_calls: int = 4
    filler_after_s: float = 0.8
    timeout_s: float | None = None


def tools_config(
    mcp: list[str], allow_urls: list[str], max_calls: int = 4, filler_ms: int = 800
) -> ToolsConfig:
    """``serve``'s ``--mcp`` / ``--mcp-allow-url`` / ``--max-tool-calls`` / ``--tool-filler-ms``.

    Raises:
        ValueError: a malformed ``--mcp`` (see :meth:`MCPServerSpec.parse`) or two servers of one name.
    """
    servers = [MCPServerSpec.parse(m) for m in mcp]
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ValueError(f"--mcp: server names must differ, got {names}")
    mcp_cfg = MCPConfig(servers, list(allow_urls))
    return ToolsConfig(mcp_cfg, max_calls=max_calls, filler_after_s=filler_ms / 1000)


def voice_tool_choice(choice: str, mcp: list[str]) -> str | dict:
    """``serve --tool-choice``: how the replies of the server-run voice sessions (browser, kiosk, phone) may
    use the ``--mcp`` tools: ``auto`` (the model decides), ``required`` (each user turn calls a tool first),
    ``none``, or a tool's name (that tool is called first: ``{"type": "function", "name": NAME}``, the
    Realtime API's form). After a forced call the reply goes on in words
    (:mod:`omniduplex.app.core.tool_turns`).

    Raises:
        ValueError: an empty choice, or ``required`` / a name without any ``--mcp`` server.
    """
    choice = choice.strip()
    if not choice:
        raise ValueError("--tool-choice: give auto, required, none or a tool's name")
    if choice in ("auto", "none"):
        return choice
    if not mcp:
        raise ValueError(f"--tool-choice {choice}: the voice sessions have no tools without --mcp")
    return choice if choice == "required" else {"type": "function", "name": choice}


@dataclass
class HostConfig:
    """The pipeline, the sessions and the services every surface shares.

    Pipeline: ``model`` / ``graph`` (``None`` = defaults: the cascade on the packaged weights; ``"tiny"`` =
    the tiny random Qwen3-Omni checkpoint), ``processes`` (``None`` = stage processes when the process
    backend is available). Replies: ``max_tokens`` (Thinker / LLM), ``talker_max_tokens`` (codec frames,
    12.5 per second of audio); ``ignore_eos`` makes every reply run to those budgets (benchmarks and tests;
    see ``pipeline.engine.request.SamplingParams``). ``start_in_background``: ``/healthz`` answers at once,
    ``/readyz`` is 503 until the stages are up (``serve``). ``tts``: the TTS checkpoint(s) serving
    ``/v1/audio/speech``, any family (``None``: Piper, :mod:`.speech.services`), a Qwen3-TTS one on the TTS
    graph's stage processes with ``tts_graph``. ``drain_timeout_s``: SIGTERM's longest wait for replies in
    flight (:mod:`.drain`).
    ``start_timeout_s``: how long a stage process has to report ready; past it a background start keeps
    waiting, the server up and answering "not ready" (:mod:`.readiness`), a foreground start fails.
    ``tools``: server-side tools from MCP servers (:class:`ToolsConfig`).
    """

    max_sessions: int = 8
    duplex_model: str | None = None
    """A Moshi checkpoint folder served on ``/v1/realtime?duplex=1`` beside the cascade (:mod:`.duplex`)."""
    duplex_sessions: int = 4
    """Rows of the duplex frame engine (concurrent duplex sessions, within ``max_sessions``)."""
    duplex_resume_s: float = 30.0
    """Grace period of a dropped ``/v1/realtime?duplex=1`` session: a reconnect within it may
    ``session.resume`` it (:meth:`.duplex.DuplexService.park`)."""
    duplex_threads: int = 1
    """torch threads of the duplex engine's ticking thread (``serve --duplex-threads``; 1 suits the CPU
    presets, whose matmuls are too small to split)."""
    duplex_surfaces: tuple[str, ...] = ()
    """Surfaces whose calls run the duplex model instead of the cascade by default (of
    :data:`DUPLEX_SURFACES`; :func:`parse_duplex_surfaces`); a call may still choose per call."""
    duplex_only: bool = False
    """``serve --model MOSHI_DIR``: the duplex model is the server's only model: no cascade is built, every
    voice surface runs the duplex model, readiness is the duplex engine's, and the cascade-only routes answer
    :data:`DUPLEX_ONLY` (:func:`duplex_only_config`)."""
    session: SessionConfig = field(default_factory=SessionConfig)
    model: str | None = None
    graph: str | None = None
    processes: bool | None = None
    max_tokens: int = 64
    talker_max_tokens: int = 125
    speaker: str = "ethan"
    system_prompt: str | None = None
    ignore_eos: bool = False
    start_in_background: bool = False
    auth: AuthConfig = field(default_factory=AuthConfig)
    tts: str | list[str] | None = None
    tts_graph: bool = False
    drain_timeout_s: float = 30.0
    start_timeout_s: float = 180.0
    tools: ToolsConfig = field(default_factory=ToolsConfig)


DUPLEX_SURFACES = ("browser", "kiosk", "phone")
"""Surfaces that can run the duplex model (``serve --duplex-surfaces``): the voice page's ``POST /offer``,
the kiosk page, the Twilio media streams and SIP calls."""


DUPLEX_ONLY = (
    "this server serves a full-duplex speech-to-speech model (serve --model MOSHI_DIR): it has no text LLM "
    "and no cascade; talk to it on /v1/realtime, the browser or kiosk page, or a phone call"
)
"""Why a cascade-only request (``/v1/chat/completions``, a call asking for ``duplex=0``) is refused on a
duplex-only server."""


def duplex_only_config(cfg: HostConfig, folder: str) -> HostConfig:
    """``cfg`` made duplex-only over the Moshi checkpoint ``folder`` (``serve --model MOSHI_DIR``): it is the
    duplex model, there is no cascade model, and every surface of :data:`DUPLEX_SURFACES` runs it (in place;
    returns ``cfg``).

    Raises:
        ValueError: ``cfg`` names another duplex model as well.
    """
    if cfg.duplex_model and cfg.duplex_model != folder:
        raise ValueError(
            f"--model {folder} is a duplex model already: it cannot serve beside --duplex-model "
            f"{cfg.duplex_model} (give a cascade --model to serve both side by side)"
        )
    cfg.duplex_model, cfg.model, cfg.duplex_only = folder, None, True
    cfg.duplex_surfaces = DUPLEX_SURFACES
    return cfg


def parse_duplex_surfaces(text: str | None, duplex_model: str | None) -> tuple[str, ...]:
    """``"browser,kiosk,phone"`` → ``("browser", "kiosk", "phone")`` (empty or ``None`` → ``()``).

    Raises:
        ValueError: an unknown surface name, or surfaces named without a duplex model to run.
    """
    names = tuple(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))
    unknown = [n for n in names if n not in DUPLEX_SURFACES]
    if unknown:
        known = ", ".join(DUPLEX_SURFACES)
        raise ValueError(f"unknown duplex surface(s) {', '.join(unknown)}; known: {known}")
    if names and not duplex_model:
        raise ValueError("duplex surfaces need a duplex model (--duplex-model DIR)")
    return names
