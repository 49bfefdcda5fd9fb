"""The pipeline as a LiveKit ``RealtimeModel``, in this process.

One model owns (or is given) one pipeline :class:`~omniduplex.app.core.replies.Responder`; every room session
it makes shares it, as the sessions of ``omniduplex serve`` do. The pipeline is bound to the event loop that
started it, so the model and its sessions live on one loop (one job process of the worker, or a test).
For workers that scale apart from model servers use :class:`~.remote.RemoteRealtimeModel`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
from dataclasses import dataclass, field, replace

from omniduplex.app.core.replies import OrchestratorResponder, Responder
from omniduplex.app.core.session import SessionConfig
from omniduplex.app.surfaces.livekit.generation import PipelineModel, pipeline_capabilities
from omniduplex.app.surfaces.livekit.local_session import PipelineRealtimeSession

log = logging.getLogger("omniduplex.livekit")


@dataclass
class PipelineOptions:
    """What :meth:`PipelineRealtimeModel.start` builds when no responder is given (as ``omniduplex serve``):
    ``model`` / ``graph`` (``None`` = the cascade on the packaged weights; ``"tiny"``), ``processes`` (stage
    processes, else all stages in this process), reply budgets ``max_tokens`` / ``talker_max_tokens``,
    ``system_prompt`` (the pipeline's default; LiveKit agent instructions replace it per session)."""

    model: str | None = None
    graph: str | None = None
    processes: bool = False
    max_tokens: int = 64
    talker_max_tokens: int = 125
    speaker: str = "ethan"
    system_prompt: str | None = None
    session: SessionConfig = field(default_factory=SessionConfig)


class PipelineRealtimeModel(PipelineModel):
    """omniduplex's pipeline behind LiveKit's realtime-model contract (capabilities:
    :func:`~.generation.pipeline_capabilities`).

    Args:
        responder: a started responder to use; ``None`` → :meth:`start` builds the pipeline from ``options``.
        options: pipeline and session settings.
        user_transcription: whether ``responder`` sends user transcripts (ignored when the model builds
            the pipeline: then the graph decides).
        turn_model: the Smart Turn model, for ``options.session.turn.turn_detection == "smart"``.
        lead_s: reply audio forwarded ahead of real time (s), see :mod:`.local_session`.
    """

    def __init__(
        self,
        *,
        responder: Responder | None = None,
        options: PipelineOptions | None = None,
        user_transcription: bool = True,
        turn_model=None,
        lead_s: float = 0.2,
    ) -> None:
        super().__init__(user_transcription, tools=True)
        self.options = options or PipelineOptions()
        self.responder, self.turn_model, self.lead_s = responder, turn_model, lead_s
        self.orchestrator = None  # the pipeline this model built (and stops)
        self._ids = itertools.count(1)
        self._prefix = f"lk{os.getpid()}-{secrets.token_hex(2)}"

    async def start(self) -> None:
        """Build and start the pipeline unless a responder was given (model loading runs in a thread)."""
        if self.responder is not None:
            return
        from omniduplex.app.core.turn_detection import load_turn_model
        from omniduplex.app.host.pipeline import new_orchestrator, resolve_model, serving_meta
        from omniduplex.pipeline.config import load_graph
        from omniduplex.pipeline.topology import CASCADE, topology_for

        o = self.options
        pcfg = load_graph(o.graph, model=o.model)
        pcfg.model = await asyncio.to_thread(resolve_model, pcfg.model)
        topo = topology_for(pcfg.model)
        log.info(
            "starting pipeline (%s) from %s", "stage processes" if o.processes else "in-process", pcfg.model
        )
        self.orchestrator = await asyncio.to_thread(new_orchestrator, pcfg, o.processes)
        await self.orchestrator.start()
        if self.turn_model is None:
            self.turn_model = await asyncio.to_thread(load_turn_model, o.session.turn)
        meta = serving_meta(
            o.max_tokens,
            o.talker_max_tokens,
            speaker=o.speaker,
            shape=topo.name,
            system_prompt=o.system_prompt,
        )
        self.responder = OrchestratorResponder(self.orchestrator, meta)
        transcribes = topo.name == CASCADE.name or bool(pcfg.topology().side)  # ASR chain or side ASR
        self._capabilities = pipeline_capabilities(transcribes, tools=True)

    def session(self, *, turn_detection_disabled: bool = False) -> PipelineRealtimeSession:
        """A new conversation over the pipeline. ``turn_detection_disabled`` is not supported (turn-taking is
        always the session's; ``capabilities.can_disable_turn_detection`` is False) and is ignored.

        Raises:
            RuntimeError: :meth:`start` has not run (no pipeline yet).
        """
        if self.responder is None:
            raise RuntimeError("PipelineRealtimeModel.start() must run before sessions are made")
        s = PipelineRealtimeSession(
            self,
            f"{self._prefix}-{next(self._ids)}",
            self.responder,
            replace(self.options.session),
            self.turn_model,
            self.lead_s,
        )
        self.sessions.add(s)
        return s

    async def aclose(self) -> None:
        """Close every session, then stop the pipeline if this model built it."""
        await super().aclose()
        if self.orchestrator is not None:
            await self.orchestrator.stop()
            self.orchestrator = None
