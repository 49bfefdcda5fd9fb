"""The host object of ``omniduplex serve``: :class:`ServerState` (on ``app.state.server``) owns the pipeline
and its responder, the session table of every surface (admission and release, :mod:`.admission`),
readiness, metrics, the API tokens, the end-of-turn model and the speech and transcription services. Every
attribute is set in ``__init__``; surfaces use its methods and read its attributes, never add to it.

The pipeline stages start with the app (lifespan) and are shared by every session; each session has its own
turn ids, history and playout buffer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import asdict

from omniduplex.app.core.replies import OrchestratorResponder, Responder
from omniduplex.app.core.turn_detection import TurnModel
from omniduplex.app.host import admission
from omniduplex.app.host.admission import Call
from omniduplex.app.host.auth import TokenStore
from omniduplex.app.host.config import HostConfig
from omniduplex.app.host.metrics import MeteredResponder, ServerMetrics
from omniduplex.app.host.speech.contract import SpeechService, Transcriber
from omniduplex.app.host.speech.services import SpeechModels, packaged_whisper
from omniduplex.app.host.tools.mcp_client import MCPHub
from omniduplex.app.host.tools.runner import MCPToolRunner

log = logging.getLogger("omniduplex.server")


def process_backend_available() -> bool:
    """Whether ``omniduplex.pipeline.runtime.process_backend`` imports (the multi-process backend)."""
    try:
        import omniduplex.pipeline.runtime.process_backend  # noqa: F401
    except ImportError:
        return False
    return True


class ServerState:
    """The host (see the module docstring).

    Args:
        cfg: the host's settings (a ``ServerConfig`` in a server: the surfaces read their own part).
        responder: use this instead of building the pipeline (tests).
    """

    def __init__(self, cfg: HostConfig, responder: Responder | None = None) -> None:
        self.cfg = cfg
        self.responder = responder
        self.orchestrator = None
        self.turn_model: TurnModel | None = None  # shared by every session (turn_detection="smart")
        self.sessions: dict[str, Call] = {}  # every surface's sessions (:mod:`.admission`)
        self.started_total = 0
        self.closed_stats: list = []  # SessionStats of closed sessions (for /stats)
        self.prom = ServerMetrics(self)  # /metrics
        self.tokens = TokenStore()  # short-lived tokens for pages and browsers (:mod:`.auth`)
        self.mcp = MCPHub(cfg.tools.mcp)  # MCP connections shared by every session (:mod:`.tools`)
        self.tool_runner = (  # server-run tools of the voice surfaces, when the operator declared servers
            MCPToolRunner(
                self.mcp,
                max_calls=cfg.tools.max_calls,
                timeout_s=cfg.tools.timeout_s,
                filler_after_s=cfg.tools.filler_after_s,
                metrics=self.prom,
            )
            if cfg.tools.mcp.servers
            else None
        )
        self.speech: SpeechService | None = None  # /v1/audio/speech's first model, given (tests)
        self.speech_models: SpeechModels | None = None  # every speech model, built on first use
        self.started = False  # the pipeline (or the given responder) is up
        self.draining = False  # SIGTERM received: no new sessions on any surface (:mod:`.drain`)
        self.start_error: Exception | None = None  # why a background start failed
        self.stopping = False  # stop() was called (a start still running is abandoned)
        self.on_start_failed = None  # called after a background start failed (serve: stop the server)
        self._starting: asyncio.Task | None = None
        self._speech_lock = threading.Lock()
        self.duplex = None  # the duplex model's frame engine and clock (cfg.duplex_model; :mod:`.duplex`)

    # -- readiness and admission ---------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Started, and every stage is up (not restarting after a crash); on a duplex-only server (no
        orchestrator): the duplex model is loaded and its clock runs."""
        backend = getattr(self.orchestrator, "backend", None)
        return self.started and bool(getattr(backend, "ready", True))

    def admit(self, call: Call) -> None:
        """Take a session slot for ``call`` (:func:`.admission.admit`).

        Raises:
            NotReady / SessionFull: see :mod:`.admission`.
        """
        admission.admit(self, call)

    def release(self, call: Call) -> bool:
        """Give ``call``'s slot back (:func:`.admission.release`; idempotent)."""
        return admission.release(self, call)

    # -- start and stop -----------------------------------------------------------------------------
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
        if self.tool_runner is not None:
            await self.tool_runner.refresh()  # a server that is down is logged and offers no tools
            named = self.cfg.session.tool_choice
            offered = {t["function"]["name"] for t in self.tool_runner.tools}
            if isinstance(named, dict) and named.get("name") not in offered:
                log.error(
                    "--tool-choice %s: no MCP server offers that tool (offered: %s); voice replies fail",
                    named.get("name"), ", ".join(sorted(offered)) or "none",
                )
        await self._start()
        if self.stopping:  # abandoned (:meth:`stop`) before the stages were up
            raise RuntimeError("stopped while starting")
        if self.cfg.duplex_model:
            from omniduplex.app.host.duplex import DuplexService

            duplex = DuplexService(
                self.cfg.duplex_model,
                self.cfg.duplex_sessions,
                resume_s=self.cfg.duplex_resume_s,
                threads=self.cfg.duplex_threads,
            )
            await asyncio.to_thread(duplex.load)
            duplex.start(asyncio.get_running_loop())
            self.duplex = duplex
        if self.responder is not None:  # (none on a duplex-only server: cfg.duplex_only)
            self.responder = MeteredResponder(self.responder, self.prom)
        self.started = True

    async def _start_in_background(self) -> None:
        try:
            await self._start_metered()
        except Exception as e:
            if self.stopping:  # the start was abandoned (stop() during it): not a failure
                log.info("pipeline start abandoned: %s", e)
                return
            self.start_error = e
            log.error("the pipeline failed to start: %s: %s", type(e).__name__, e)
            if self.on_start_failed is not None:
                self.on_start_failed()

    async def _start(self) -> None:
        """Load the end-of-turn model; build and start the pipeline unless a responder was given. A
        duplex-only server (``cfg.duplex_only``) has neither: the duplex model is loaded after this."""
        from omniduplex.app.core.turn_detection import load_turn_model

        if self.cfg.duplex_only:
            log.info("duplex-only server: no cascade pipeline (the duplex model %s)", self.cfg.duplex_model)
            return
        self.turn_model = await asyncio.to_thread(load_turn_model, self.cfg.session.turn)
        if self.responder is not None or self.stopping:
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
        self.orchestrator = await asyncio.to_thread(
            new_orchestrator,
            pcfg,
            processes,
            start_timeout_s=cfg.start_timeout_s,
            wait_when_late=cfg.start_in_background,
        )
        if self.stopping:
            self._abandon_start()
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
        """Close every session, then stop the pipeline and the speech service it loaded. A background start
        still running is abandoned: stage processes still loading are killed (in-process stages finish the
        load step they are in first)."""
        if self._starting is not None:
            if not self._starting.done():
                self.stopping = True
                log.warning("stopping while the pipeline is still starting: the start is abandoned")
                self._abandon_start()
            await self._starting
        await asyncio.gather(*(c.close("server shutdown") for c in list(self.sessions.values())))
        if self.duplex is not None:
            await asyncio.to_thread(self.duplex.stop)
        if self.orchestrator is not None and getattr(self.orchestrator.backend, "running", True):
            # (stage processes whose start failed or was abandoned were stopped by the start itself)
            await self.orchestrator.stop()
        if self.speech_models is not None:
            await asyncio.to_thread(self.speech_models.close)
        await self.mcp.aclose()

    def _abandon_start(self) -> None:
        """Make a stage-process start still waiting for its stages give up (``ProcessBackend.abandon_start``;
        an in-process backend has none: its load step runs to its end)."""
        abandon = getattr(getattr(self.orchestrator, "backend", None), "abandon_start", None)
        if abandon is not None:
            abandon()

    # -- shared models and services ---------------------------------------------------------------------
    def smart_turn_model(self) -> TurnModel:
        """The Smart Turn model, loaded on first use (a Realtime ``semantic_vad`` session on a server whose
        default is the silence endpoint)."""
        if self.turn_model is None:
            from omniduplex.app.core.turn_detection import SmartTurnModel

            self.turn_model = SmartTurnModel()
        return self.turn_model

    def speech_registry(self) -> SpeechModels:
        """The server's speech models (:class:`.speech.services.SpeechModels`; :attr:`speech`, when given,
        serves the first)."""
        with self._speech_lock:
            if self.speech_models is None:
                self.speech_models = SpeechModels(self.cfg, self.speech)
        return self.speech_models

    def speech_service(self, model: str | None = None) -> SpeechService:
        """The ``/v1/audio/speech`` service of ``model`` (``None``: the first), loaded on first use
        (blocking: call it in a worker thread).

        Raises SpeechError: an unknown model (``model_not_found``)."""
        return self.speech_registry().get(model)

    def transcriber(self) -> Transcriber:
        """The ``/v1/audio/transcriptions`` model: the packaged Whisper, loaded once a process (blocking)."""
        return packaged_whisper()

    # -- /stats ------------------------------------------------------------------------------------
    def metrics(self) -> dict:
        """Counters, per-event measurements and pipeline resources (JSON-able)."""
        stats = [c.session.stats for c in self.sessions.values()] + self.closed_stats
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
            "duplex": self.duplex.stats() if self.duplex is not None else None,
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
