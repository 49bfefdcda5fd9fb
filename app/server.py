"""``omniduplex serve``: the FastAPI app that puts every surface over one host.

Routes (the surfaces' own docstrings give their details):
    ``GET /``            the voice chat page (``web/``); ``POST /offer``, ``/sessions/{id}``: its WebRTC
                         signalling (:mod:`.surfaces.browser.routes`).
    ``GET /kiosk``       the kiosk page and ``/kiosk/config.json`` (:mod:`.surfaces.kiosk.routes`).
    ``ws /v1/realtime``, ``POST /v1/realtime/client_secrets``  the Realtime API (:mod:`.surfaces.realtime`).
    ``/v1/models``, ``/v1/audio/*``  the REST audio endpoints (:mod:`.surfaces.rest`).
    ``/phone/twilio/*``  the Twilio media-stream bridge (:mod:`.surfaces.phone.twilio_routes`); with ``sip``
                         set, the SIP UAS runs beside it (:mod:`.surfaces.phone.sip`).
    ``POST /session-token``  a short-lived token for a browser page (needs an API key).
    ``GET /healthz``     liveness and session count (answers while the pipeline is still starting).
    ``GET /readyz``      200 once every stage is up, 503 before (and while a crashed stage restarts, and while
                         draining) with ``{"status", "reason", "stages"}`` (:mod:`.host.readiness`).
    ``GET /metrics``     Prometheus text: latency histograms, counters, stage and relay gauges
                         (:mod:`.host.metrics`).
    ``GET /stats``       JSON: sessions, turn counters, barge-in stop times, latencies, pipeline resources.

This module is the composition root: the only one that knows every surface. The host
(:class:`~.host.state.ServerState`, on ``app.state.server``) knows none of them.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from omniduplex.app.core.replies import Responder
from omniduplex.app.host import logs
from omniduplex.app.host.auth import SERVER_ACCESS, EdgeGate
from omniduplex.app.host.config import HostConfig
from omniduplex.app.host.metrics import CONTENT_TYPE
from omniduplex.app.host.readiness import readiness
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.browser import routes as browser
from omniduplex.app.surfaces.chat import routes as chat
from omniduplex.app.surfaces.kiosk import routes as kiosk
from omniduplex.app.surfaces.kiosk.config import KioskConfig
from omniduplex.app.surfaces.phone import twilio_routes as phone
from omniduplex.app.surfaces.phone.config import SipConfig, TwilioConfig
from omniduplex.app.surfaces.realtime import routes as realtime
from omniduplex.app.surfaces.rest import routes as rest

log = logging.getLogger("omniduplex.server")

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
"""The browser client, at the repository's top level (works from an editable install)."""


@dataclass
class ServerConfig(HostConfig):
    """Everything ``serve`` needs: the host's settings (:class:`~.host.config.HostConfig`), then the
    surfaces'. Browser sessions end after ``media_timeout_s`` without client audio (``connect_timeout_s``
    before the first); ``web_dir``: the pages; ``twilio``: ``/phone/twilio/*``; ``sip``: the SIP UAS, started
    with the app when set; ``kiosk``: the ``/kiosk`` page (its greeting is also what a browser page's
    ``greet`` message says); ``ws_max_bytes``: the largest WebSocket message (uvicorn ``ws_max_size``)."""

    media_timeout_s: float = 5.0
    connect_timeout_s: float = 20.0
    web_dir: Path = WEB_DIR
    twilio: TwilioConfig = field(default_factory=TwilioConfig)
    sip: SipConfig | None = None
    kiosk: KioskConfig = field(default_factory=KioskConfig)
    ws_max_bytes: int = 4 << 20


def kiosk_server_config(kiosk_cfg: KioskConfig, **kwargs) -> ServerConfig:
    """A :class:`ServerConfig` for ``omniduplex kiosk``: ``kwargs`` as for ``serve``, then the kiosk's system
    prompt, voice and turn detection on top."""
    cfg = ServerConfig(**kwargs)
    cfg.kiosk = kiosk_cfg
    if kiosk_cfg.system_prompt:
        cfg.system_prompt = kiosk_cfg.system_prompt
    if kiosk_cfg.voice:
        cfg.speaker = kiosk_cfg.voice
    cfg.session.turn = replace(cfg.session.turn, turn_detection=kiosk_cfg.turn_detection)
    return cfg


def create_app(cfg: ServerConfig | None = None, responder: Responder | None = None) -> FastAPI:
    """The FastAPI app. ``responder``: use this instead of building the pipeline (tests)."""
    cfg = cfg or ServerConfig()
    state = ServerState(cfg, responder)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.start()
        sip = None
        if cfg.sip is not None:
            from omniduplex.app.surfaces.phone.sip import start_sip

            sip = await start_sip(state, cfg.sip)
        app.state.sip = sip
        try:
            yield
        finally:
            await state.stop()  # hangs up phone calls too (BYE goes out before the SIP sockets close)
            if sip is not None:
                await sip.stop()

    app = FastAPI(title="omniduplex", lifespan=lifespan)
    app.state.server = state
    app.state.tokens = state.tokens

    @app.post("/session-token")
    async def session_token():
        """A short-lived token for a browser page (``?token=`` on ``/`` or ``/kiosk``); needs an API key."""
        value, expires_at = state.tokens.mint(cfg.auth.token_ttl_s)
        return {"token": value, "expires_at": expires_at}

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "sessions": len(state.sessions), "max_sessions": cfg.max_sessions}

    @app.get("/readyz")
    async def readyz():
        body = readiness(state)  # draining: load balancers stop sending new sessions here
        return body if body["status"] == "ready" else JSONResponse(body, 503)

    @app.get("/metrics")
    async def metrics():
        return Response(state.prom.render(), media_type=CONTENT_TYPE)

    @app.get("/stats")
    async def stats():
        return state.metrics()

    if "kiosk" in cfg.duplex_surfaces:  # the page asks for the duplex model in its offers
        cfg.kiosk = replace(cfg.kiosk, duplex=True)
    peers = browser.PeerOptions(cfg.kiosk.greeting, cfg.media_timeout_s, cfg.connect_timeout_s)
    surfaces = (  # each surface's routes and what the edge asks of them (API key, public, signed)
        (browser.router(state, peers), browser.ACCESS),
        (phone.router(state, cfg.twilio), phone.access(cfg.twilio)),
        (kiosk.router(cfg.kiosk, cfg.web_dir), kiosk.ACCESS),
        (realtime.router(state), realtime.ACCESS),
        (chat.router(state), chat.ACCESS),
        (rest.router(state), rest.ACCESS),
    )
    for routes, _ in surfaces:
        app.include_router(routes)
    access = [*SERVER_ACCESS, *(a for _, declared in surfaces for a in declared)]
    app.add_middleware(EdgeGate, cfg=cfg.auth, tokens=state.tokens, access=access)

    if cfg.web_dir.is_dir():
        app.mount("/", StaticFiles(directory=cfg.web_dir, html=True), name="web")
    else:
        log.warning("no web client at %s; serving the API only", cfg.web_dir)
    return app


def check_graph(cfg: ServerConfig) -> None:
    """What :func:`serve` checks before it binds its port: the stage-graph file is valid and every stage of
    the model's graph has its engine installed (``backend: vllm`` needs vLLM), so these fail as one line at
    once rather than after the background start. A model that cannot be read is left to the start to report.

    Raises:
        GraphConfigError: an invalid graph file; ``VLLMUnavailableError`` (a subclass): no vLLM for a stage
            that asks for it.
    """
    from omniduplex.pipeline.config import load_graph
    from omniduplex.pipeline.runtime.stage_engines import check_backends
    from omniduplex.pipeline.topology import CASCADE

    if cfg.duplex_only:  # no cascade graph to check: the duplex model alone
        return
    pcfg = load_graph(cfg.graph, model=cfg.model)
    try:
        stages = CASCADE.all_stages if pcfg.model is None else pcfg.topology().all_stages
    except Exception:
        return
    check_backends(pcfg, stages)


def serve(
    cfg: ServerConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    log_json: bool = False,
) -> None:
    """Run the app under uvicorn until interrupted. The pipeline starts in the background (``/readyz``);
    ``log_json``: one JSON object per log line (:mod:`.host.logs`). SIGTERM/SIGINT drain first: new sessions
    are refused and replies in flight finish (up to ``cfg.drain_timeout_s``), see :mod:`.host.drain`.

    Raises:
        GraphConfigError: an invalid graph, or no vLLM for a ``backend: vllm`` stage (:func:`check_graph`),
            before the port is bound.
        Exception: why the pipeline failed to start (the server stops then), e.g. ``StageStartError``.
    """
    import uvicorn

    from omniduplex.app.host.drain import DrainingServer

    check_graph(cfg)
    logs.configure(log_level, log_json)
    app = create_app(replace(cfg, start_in_background=True))
    state: ServerState = app.state.server
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            ws_max_size=cfg.ws_max_bytes,
            log_config=None,  # uvicorn's loggers propagate to the root handler of logs.configure
        ),
        state,
        cfg.drain_timeout_s,
    )
    state.on_start_failed = lambda: setattr(server, "should_exit", True)
    server.run()
    if state.start_error is not None:
        raise state.start_error
