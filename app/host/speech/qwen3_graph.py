"""Qwen3-TTS behind ``POST /v1/audio/speech`` on the TTS graph (``serve --tts DIR --tts-graph``): the talker
(+ code predictor) and the codec decoder in two stage processes joined by the relay
(:data:`~omniduplex.pipeline.topology.QWEN3_TTS`), concurrent requests' chunks decoded in one batched call.

The same contract as :class:`~.qwen3.Qwen3Speech` (:class:`~.contract.SpeechService`), so the route serves
either. The server process loads no weights: :meth:`Qwen3GraphSpeech.prompt` checks what it can without them
(the reference clip's encoding, rate and length); the voice checks run in the talker stage, and a request they
refuse ends its ``stream`` with :class:`~.contract.SpeechError` before any audio, which the route turns into
a 400. The stages start with the first request (the graph's start-up time).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omniduplex.app.host.pipeline import make_backend
from omniduplex.app.host.speech.contract import SpeechError, SpeechRequest, SpeechService
from omniduplex.app.host.speech.qwen3 import decode_ref_audio
from omniduplex.models.checkpoint import read_config
from omniduplex.models.qwen3_tts.config import TTSConfig
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE
from omniduplex.pipeline.config import PipelineConfig, load_graph
from omniduplex.pipeline.messages import TurnOptions, UtteranceRequest
from omniduplex.pipeline.orchestrator import Orchestrator

STAGE_PREFIX = "tts_talker: "
"""How the talker stage prefixes the reasons it refuses a request (:mod:`.stage_process`)."""


@dataclass
class GraphRequest:
    """One checked request: the utterance and the reference clip of :meth:`Orchestrator.speak`."""

    utterance: UtteranceRequest
    ref_audio: np.ndarray | None = None


class Qwen3GraphSpeech(SpeechService):
    """A Qwen3-TTS checkpoint served on its graph.

    Args:
        model_dir: the checkpoint (any variant).
        graph: the graph settings (default: ``default_graph.yaml`` with this model, no side ASR).
        processes: stage processes (``True``) or the stages in this process (tests).
        max_frames: codec frames per request at most (12.5 per second of audio).
        sampling: :class:`~omniduplex.pipeline.engine.request.SamplingParams` fields over the reference's
            defaults for every request (``{"temperature": 0}``: greedy).

    Raises:
        CheckpointError / ConfigError: not a readable Qwen3-TTS checkpoint.
    """

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        model_dir: str | Path,
        graph: PipelineConfig | None = None,
        processes: bool = True,
        max_frames: int = 2048,
        sampling: dict | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        cfg = TTSConfig.from_dict(read_config(self.model_dir))
        self.variant = cfg.variant
        self.voices = sorted(cfg.speakers) if cfg.variant == "custom_voice" else []
        self.pcfg = graph or load_graph(None, model=str(self.model_dir), side_asr=None)
        self.pcfg.model, self.pcfg.side_asr = str(self.model_dir), None
        self.processes, self.max_frames, self.sampling = processes, max_frames, dict(sampling or {})
        self.orch: Orchestrator | None = None
        self._starting: asyncio.Lock | None = None

    def describe(self) -> dict:
        """As :meth:`.qwen3.Qwen3Speech.describe` (read from the config: no weights in this process)."""
        return {
            "family": "qwen3-tts",
            "voices": [{"name": v} for v in self.voices],
            "cloning": self.variant == "base",
            "instructions": self.variant != "base",
        }

    def prepare(self, request: SpeechRequest) -> GraphRequest:
        """Check what the server process can and package the request.

        Raises SpeechError: a reference clip that is not base64 24 kHz audio of at least 1 s.
        """
        r = request
        turn = TurnOptions(voice=r.voice, sampling={**self.sampling, "max_tokens": self.max_frames})
        utterance = UtteranceRequest(
            turn=turn, text=r.text, language=r.language, instructions=r.instructions, ref_text=r.ref_text
        )
        ref = decode_ref_audio(r.ref_audio) if r.ref_audio is not None else None
        return GraphRequest(utterance, ref)

    async def _orchestrator(self) -> Orchestrator:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self.orch is None:
                backend = await asyncio.to_thread(make_backend, self.pcfg, self.processes)
                orch = Orchestrator(backend, None, output_rate=SAMPLE_RATE)
                await orch.start()
                self.orch = orch
        return self.orch

    async def stream(self, request: GraphRequest) -> AsyncIterator[np.ndarray]:
        """Speak ``request``: float32 24 kHz pieces ``[n]`` as the codec stage sends them. Leaving the
        iteration early (client gone) cancels the request in both stages.

        Raises SpeechError: the talker stage refused the request (an unknown voice, a prompt past the
        context, ...: its reason), or it failed on the way.
        """
        orch = await self._orchestrator()
        rid = orch.speak(request.utterance, request.ref_audio)
        done = False
        try:
            async for ev in orch.events(rid):
                if ev.kind == "audio":
                    yield ev.pcm
                elif ev.kind == "error":
                    done = True
                    raise SpeechError(ev.error.removeprefix(STAGE_PREFIX))
                elif ev.kind == "done":
                    done = True
                    return
        finally:
            if not done:
                orch.cancel(rid)

    def close(self) -> None:
        """Stop the stages (requests in flight get no more audio)."""
        if self.orch is not None:
            with contextlib.suppress(Exception):
                self.orch.backend.stop()
            self.orch = None
