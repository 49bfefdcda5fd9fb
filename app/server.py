"""``omniduplex serve``: FastAPI app with the voice chat page, WebRTC signalling and the pipeline.

Routes:
    ``GET /``            the voice chat page (``web/``).
    ``POST /offer``      ``{"sdp", "type": "offer"}`` → ``{"sdp", "type": "answer", "session_id"}``;
                         400 with ``{"error"}`` for a bad offer, 503 when ``max_sessions`` are open, and 503
                         with ``{"error": reason, "status"}`` and ``Retry-After`` while the stages start or
                         restart (:mod:`.readiness`).
    ``DELETE /sessions/{id}``, ``POST /sessions/{id}/bye``  hang up a session (the page also says
                         ``bye`` on the data channel).
    ``GET /kiosk``       the kiosk page; ``GET /kiosk/config.json`` its settings (``app/kiosk_routes.py``).
    ``GET /healthz``     liveness and session count (answers while the pipeline is still starting).
    ``GET /readyz``      200 once every stage is up, 503 before (and while a crashed stage restarts) with
                         ``{"status", "reason", "stages"}``: which stage is starting or restarting.
    ``GET /metrics``     Prometheus text: latency histograms, counters, stage and relay gauges (app.metrics).
    ``GET /stats``       JSON: sessions, turn counters, barge-in stop times, latencies, pipeline resources.

The pipeline stages start with the app (lifespan) and are shared by every session; each session
has its own turn ids, history and playout buffer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from omniduplex.app.core.replies import OrchestratorResponder, Responder
from omniduplex.app.core.session import SessionConfig
from omniduplex.app.host import logs
from omniduplex.app.host.auth import AuthConfig, EdgeGate, TokenStore
from omniduplex.app.host.heap import release_free_memory
from omniduplex.app.host.metrics import CONTENT_TYPE, MeteredResponder, ServerMetrics
from omniduplex.app.host.readiness import RETRY_AFTER_S, readiness, unready_reason
from omniduplex.app.surfaces.browser.webrtc import OfferError, PeerSession, check_offer
from omniduplex.app.surfaces.kiosk.config import KioskConfig
from omniduplex.app.surfaces.kiosk.routes import router as kiosk_router
from omniduplex.app.surfaces.phone.config import SipConfig, TwilioConfig
from omniduplex.app.surfaces.phone.routes import router as phone_router
from omniduplex.app.surfaces.realtime.routes import router as realtime_router

log = logging.getLogger("omniduplex.server")

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
"""The browser client, at the repository's top level (works from an editable install)."""


@dataclass
class ServerConfig:
    """Everything ``serve`` needs. Pipeline: ``model`` / ``graph`` (``None`` = defaults: the cascade on
    the packaged weights; ``"tiny"`` = the tiny random Qwen3-Omni checkpoint), ``processes``
    (``None`` = stage processes when the process backend is available). Replies: ``max_tokens``
    (Thinker), ``talker_max_tokens`` (codec frames, 12.5 per second of audio); ``ignore_eos`` makes every
    reply run to those budgets (benchmarks and tests; see ``pipeline.engine.request.SamplingParams``)."""

    max_sessions: int = 8
    session: SessionConfig = field(default_factory=SessionConfig)
    model: str | None = None
    graph: str | None = None
    processes: bool | None = None
    max_tokens: int = 64
    talker_max_tokens: int = 125
    speaker: str = "ethan"
    system_prompt: str | None = None
    ignore_eos: bool = False
    media_timeout_s: float = 5.0
    connect_timeout_s: float = 20.0
    web_dir: Path = WEB_DIR
    twilio: TwilioConfig = field(default_factory=TwilioConfig)  # /phone/twilio/* (app/phone)
    sip: SipConfig | None = None  # the SIP UAS, started with the app when set (app/phone/sip)
    start_in_background: bool = False  # serve: /healthz at once, /readyz 503 until the stages are up
    auth: AuthConfig = field(default_factory=AuthConfig)  # API keys and limits (app/auth.py)
    ws_max_bytes: int = 4 << 20  # largest WebSocket message (uvicorn ws_max_size)
    kiosk: KioskConfig = field(default_factory=KioskConfig)  # /kiosk page settings (app/kiosk.py)
    tts: str | None = None  # Qwen3-TTS checkpoint serving /v1/audio/speech (app/speech.py); None: Piper
    tts_graph: bool = False  # serve it on the TTS graph's stage processes (app/speech_graph.py)
    drain_timeout_s: float = 30.0  # SIGTERM: longest wait for replies in flight before closing (app/drain.py)


def process_backend_available() -> bool:
    """Whether ``omniduplex.pipeline.process_backend`` imports (the multi-process backend)."""
    try:
        import omniduplex.pipeline.process_backend  # noqa: F401
    except ImportError:
        return False
    return True


class SessionFull(RuntimeError):
    """All ``max_sessions`` slots are taken."""


class NotReady(SessionFull):
    """The pipeline is still starting (or failed to): no session can be served yet."""


class ServerState:
    """Open sessions, the shared responder, counters. Lives on ``app.state.server``."""

    def __init__(self, cfg: ServerConfig, responder: Responder | None = None) -> None:
        self.cfg = cfg
        self.responder = responder
        self.orchestrator = None
        self.turn_model = None  # the end-of-turn model shared by every session (turn_detection="smart")
        self.sessions: dict[str, PeerSession] = {}
        self.started_total = 0
        self.closed_stats: list = []  # SessionStats of closed sessions (for /stats)
        self._ids = itertools.count(1)
        self.prom = ServerMetrics(self)  # /metrics
        self.started = False  # the pipeline (or the given responder) is up
        self.draining = False  # SIGTERM received: no new sessions on any surface (app/drain.py)
        self.start_error: Exception | None = None  # why a background start failed
        self.on_start_failed = None  # called after a background start failed (serve: stop the server)
        self._starting: asyncio.Task | None = None

    @property
    def ready(self) -> bool:
        """Started, and every stage is up (not restarting after a crash)."""
        backend = getattr(self.orchestrator, "backend", None)
        return self.started and bool(getattr(backend, "ready", True))

    async def start(self) -> None:
        """Start (:meth:`_start`) and meter the responder (:class:`~.metrics.MeteredResponder`). With
        ``cfg.start_in_background`` it returns at once and the start runs as a task: :attr:`ready` says when
        it is done; a failure is logged on one line, kept in :attr:`start_error`, and ``on_start_failed()``
        is called."""
        if self.cfg.start_in_background:
            self._starting = asyncio.create_task(self._start_in_background(), name="omniduplex-start")
        else:
            await self._start_metered()

    async def _start_metered(self) -> None:
        await self._start()
        self.responder = MeteredResponder(self.responder, self.prom)
        self.started = True

    async def _start_in_background(self) -> None:
        try:
            await self._start_metered()
        except Exception as e:
            self.start_error = e
            log.error("the pipeline failed to start: %s: %s", type(e).__name__, e)
            if self.on_start_failed is not None:
                self.on_start_failed()

    async def _start(self) -> None:
        """Load the end-of-turn model; build and start the pipeline unless a responder was given."""
        from omniduplex.app.core.turn_detection import load_turn_model

        self.turn_model = await asyncio.to_thread(load_turn_model, self.cfg.session.turn)
        if self.responder is not None:
            return
        from omniduplex.app.host.pipeline import new_orchestrator, resolve_model, serving_meta
        from omniduplex.pipeline.config import load_graph
        from omniduplex.pipeline.topology import topology_for

        cfg = self.cfg
        pcfg = load_graph(cfg.graph, model=cfg.model)
        pcfg.model = await asyncio.to_thread(resolve_model, pcfg.model)
        processes = process_backend_available() if cfg.processes is None else cfg.processes
        log.info(
            "starting pipeline (%s) from %s", "stage processes" if processes else "in-process", pcfg.model
        )
        self.orchestrator = await asyncio.to_thread(new_orchestrator, pcfg, processes)
        await self.orchestrator.start()
        meta = serving_meta(
            cfg.max_tokens,
            cfg.talker_max_tokens,
            ignore_eos=cfg.ignore_eos,
            speaker=cfg.speaker,
            shape=topology_for(pcfg.model).name,
            system_prompt=cfg.system_prompt,
        )
        self.responder = OrchestratorResponder(self.orchestrator, meta)

    async def stop(self) -> None:
        """Close every session, then stop the pipeline (after a background start has finished)."""
        if self._starting is not None:
            await self._starting
        await asyncio.gather(*(p.close("server shutdown") for p in list(self.sessions.values())))
        if self.orchestrator is not None:
            await self.orchestrator.stop()
        speech = getattr(self, "speech", None)  # /v1/audio/speech's Qwen3-TTS (app/realtime/routes.py)
        if speech is not None and getattr(self, "speech_owned", False):  # loaded by the route, not given
            await asyncio.to_thread(speech.close)

    async def open(self, sdp: str) -> tuple[str, str]:
        """Answer an offer with a new session; returns ``(session_id, answer_sdp)``.

        Raises:
            SessionFull: no free slot (:class:`NotReady`: the pipeline is not up). OfferError: the offer
                cannot be answered.
        """
        reason = unready_reason(self)
        if reason is not None:
            raise NotReady(f"not ready, try again later: {reason}")
        if self.draining:
            raise SessionFull("the server is shutting down (draining): no new sessions")
        if len(self.sessions) >= self.cfg.max_sessions:
            raise SessionFull(
                f"server is full: {len(self.sessions)} of {self.cfg.max_sessions} sessions in use"
            )
        sid = f"s{next(self._ids)}-{secrets.token_hex(3)}"
        peer = PeerSession(
            sid,
            self.responder,
            replace(self.cfg.session),
            self._closed,
            self.cfg.media_timeout_s,
            self.cfg.connect_timeout_s,
            self.turn_model,
        )
        peer.greeting = self.cfg.kiosk.greeting  # what a {"type": "greet"} message has it say
        self.sessions[sid] = peer  # take the slot before awaiting, so concurrent offers count it
        try:
            answer = await peer.answer(sdp)
        except Exception:
            self.sessions.pop(sid, None)
            raise
        self.started_total += 1
        log.info("session %s opened (%d/%d)", sid, len(self.sessions), self.cfg.max_sessions)
        return sid, answer

    async def _closed(self, peer: PeerSession) -> None:
        if self.sessions.pop(peer.id, None) is not None:
            self.closed_stats.append(peer.session.stats)
            del self.closed_stats[:-256]
            log.info("session %s closed (%d/%d)", peer.id, len(self.sessions), self.cfg.max_sessions)
            release_free_memory()

    def metrics(self) -> dict:
        """Counters, per-event measurements and pipeline resources (JSON-able)."""
        stats = [p.session.stats for p in self.sessions.values()] + self.closed_stats
        stop = [x for s in stats for x in s.stop_ms]
        lat = [x for s in stats for x in s.latency_ms]
        return {
            "sessions": len(self.sessions),
            "max_sessions": self.cfg.max_sessions,
            "sessions_started": self.started_total,
            "turns": sum(s.turns for s in stats),
            "barge_ins": sum(s.barge_ins for s in stats),
            "barge_in_stop_ms": summarize(stop),
            "speech_end_to_first_audio_ms": summarize(lat),
            "pipeline": pipeline_resources(self.orchestrator),
            "config": {"session": asdict(self.cfg.session)},
        }


def summarize(xs: list[float]) -> dict:
    """``n``, ``p50``, ``p90``, ``max`` and ``last`` of a list of ms values (``None`` when empty)."""
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "max": None, "last": None}
    s = sorted(xs)
    return {
        "n": len(s),
        "p50": s[len(s) // 2],
        "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
        "max": s[-1],
        "last": xs[-1],
    }


def pipeline_resources(orchestrator) -> dict:
    """Turns in flight and, for the in-process backend, KV blocks and decode streams per stage."""
    if orchestrator is None:
        return {}
    out: dict = {"turns_in_flight": len(orchestrator.turns)}
    backend = orchestrator.backend
    workers = getattr(backend, "workers", None)
    for stage, w in (workers or {}).items():
        if hasattr(w, "engine"):  # thinker, talker, unified
            alloc = w.engine.scheduler.allocator
            out[stage] = {
                "kv_blocks_free": alloc.num_free,
                "kv_blocks_total": alloc.num_blocks,
                "unfinished": bool(w.engine.has_unfinished()),
            }
        elif hasattr(w, "streams"):  # code2wav, codec
            out[stage] = {"streams": len(w.streams)}
        elif hasattr(w, "pending"):  # encoder, codec_encoder
            out[stage] = {"pending": len(w.pending)}
    if hasattr(backend, "inflight"):
        out["backend_inflight"] = len(backend.inflight)
    return out


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
    app.state.tokens = TokenStore()
    app.add_middleware(
        EdgeGate, cfg=cfg.auth, tokens=app.state.tokens, twilio_signed=cfg.twilio.auth_token is not None
    )

    @app.post("/session-token")
    async def session_token():
        """A short-lived token for a browser page (``?token=`` on ``/`` or ``/kiosk``); needs an API key."""
        value, expires_at = app.state.tokens.mint(cfg.auth.token_ttl_s)
        return {"token": value, "expires_at": expires_at}

    @app.post("/offer")
    async def offer(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": 'body must be JSON: {"sdp": ..., "type": "offer"}'}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "body must be a JSON object with 'sdp' and 'type'"}, 400)
        try:
            sdp = check_offer(body.get("sdp"), body.get("type"))
            sid, answer = await state.open(sdp)
        except NotReady as e:
            retry = {"Retry-After": str(RETRY_AFTER_S)}
            return JSONResponse({"error": str(e), "status": readiness(state)["status"]}, 503, headers=retry)
        except SessionFull as e:
            return JSONResponse({"error": str(e), "max_sessions": cfg.max_sessions}, 503)
        except OfferError as e:
            return JSONResponse({"error": f"bad offer: {e}"}, 400)
        return {"sdp": answer, "type": "answer", "session_id": sid}

    @app.delete("/sessions/{session_id}")
    @app.post("/sessions/{session_id}/bye")  # navigator.sendBeacon on page unload
    async def hang_up(session_id: str):
        peer = state.sessions.get(session_id)
        if peer is None:
            return JSONResponse({"error": f"no session {session_id!r}"}, 404)
        await peer.close("client hung up")
        return {"closed": session_id}

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

    app.include_router(phone_router)
    app.include_router(kiosk_router)
    app.include_router(realtime_router)

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
    from omniduplex.pipeline.stage_engines import check_backends
    from omniduplex.pipeline.topology import CASCADE

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
    ``log_json``: one JSON object per log line (:mod:`.logs`). SIGTERM/SIGINT drain first: new sessions
    are refused and replies in flight finish (up to ``cfg.drain_timeout_s``), see :mod:`.drain`.

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
