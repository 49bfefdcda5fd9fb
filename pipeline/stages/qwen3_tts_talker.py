"""Stage 1 of the Qwen3-TTS graph (:data:`~omniduplex.pipeline.topology.QWEN3_TTS`): text + voice → codec
frames, every utterance on one continuous-batching engine (talker + code predictor, paged KV, voice
prompts shared through the prefix cache: :class:`~omniduplex.pipeline.speech.qwen3_tts.Qwen3TTSEngine`).

Input: one message per utterance (``last=True``), meta ``text`` (str, required), ``voice`` (CustomVoice
speaker), ``instructions``, ``language`` (default ``auto``), ``ref_text``, ``sampling`` (dict of
:class:`~omniduplex.pipeline.engine.request.SamplingParams` fields over the stage's; ``max_tokens`` is capped
by the stage's ``max_frames`` and the context); tensor ``ref_audio`` float32 ``[n]`` at 24 kHz (Base
checkpoints: the clip to clone). The request fields mean what they mean for ``POST /v1/audio/speech``
(:mod:`omniduplex.app.host.speech.qwen3`); a request the checkpoint cannot serve raises ValueError in
``submit``
(:class:`~omniduplex.models.qwen3_tts.voice.VoiceError`: the stage fails that utterance alone, with the
reason).

Output per codec frame: ``codes`` int64 ``[16]``; the first carries meta ``talker_ms`` (admission → that
frame, ms). ``last`` closes the utterance (its message carries no codes).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from omniduplex.models.qwen3_tts.voice import VoiceError, VoicePrompter
from omniduplex.pipeline.messages import DecoderOutput, StageMessage, UtteranceRequest
from omniduplex.pipeline.runtime.stage_stats import engine_stats
from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine
from omniduplex.pipeline.stages.contract import WorkerBase


class Qwen3TTSTalkerWorker(WorkerBase):
    """The talker stage.

    Args:
        tts: the engine of a checkpoint loaded with its talker (and, for Base, speaker / codec encoders).
        prompter: checks voices and builds prompts; its ``context`` bounds prompt + frames.
        max_frames: codec frames per utterance at most (12.5 per second of audio).
        sampling: :class:`SamplingParams` fields over the reference's defaults, for every utterance.
    """

    def __init__(
        self,
        tts: Qwen3TTSEngine,
        prompter: VoicePrompter,
        max_frames: int = 2048,
        sampling: dict | None = None,
    ) -> None:
        self.tts, self.engine = tts, tts.engine  # ``engine``: the KV gauges of stage_stats
        self.prompter, self.max_frames, self.sampling = prompter, max_frames, dict(sampling or {})
        self.started: dict[str, float] = {}  # utterances with no frame out yet → admission time
        self.step_s, self.frames = 0.0, 0  # engine time and frames made so far

    @torch.no_grad()
    def submit(self, msg: StageMessage) -> None:
        """Admit one utterance.

        Raises ValueError: not an :class:`~omniduplex.pipeline.messages.UtteranceRequest`, no text, a bad
        voice or sampling field, a prompt past the context, a duplicate id (nothing is queued then).
        """
        meta, rid = msg.meta, msg.request_id
        if not isinstance(meta, UtteranceRequest):
            got = type(meta).__name__
            raise ValueError(f"utterance {rid}: the talker takes an UtteranceRequest, got {got}")
        text = meta.text
        if not text.strip():
            raise ValueError("text must be a non-empty string")
        sampling = meta.options.sampling or {}
        ref = msg.tensors.get("ref_audio")
        wav = None if ref is None else np.asarray(ref.float().reshape(-1).numpy())
        language = meta.language or "auto"
        voice = self.prompter.voice(meta.options.voice, meta.instructions, language, wav, meta.ref_text)
        prompt = self.prompter.prompt(text, voice)
        room = self.prompter.context - prompt.prefill.shape[0]
        frames = min(int(sampling.get("max_tokens", self.max_frames)), self.max_frames, room)
        try:
            self.tts.add(rid, prompt, {**self.sampling, **sampling, "max_tokens": frames})
        except TypeError as e:  # an unknown sampling field
            raise VoiceError(f"bad sampling parameters: {e}", "sampling") from e
        self.started[rid] = time.perf_counter()

    def abort(self, request_id: str) -> None:
        self.tts.abort(request_id)
        self.started.pop(request_id, None)

    def has_work(self) -> bool:
        return self.tts.has_unfinished()

    def stats(self) -> dict:
        """The engine's gauges (:func:`~..stage_stats.engine_stats`), plus ``step_s`` (engine steps'
        wall time so far, s) and ``frames`` (codec frames made so far)."""
        return {**engine_stats(self.engine), "step_s": self.step_s, "frames": self.frames}

    def step(self) -> list[StageMessage]:
        """One engine step: a ``codes`` message per utterance that made a frame, ``last`` for those done."""
        outs = []
        t0 = time.perf_counter()
        events = self.tts.step()
        self.step_s += time.perf_counter() - t0
        for ev in events:
            meta = DecoderOutput(finish_reason=ev.finish_reason if ev.finished else None)
            t0 = self.started.pop(ev.request_id, None)
            if t0 is not None and ev.codes is not None:
                meta.talker_ms = 1000 * (time.perf_counter() - t0)
            elif t0 is not None and not ev.finished:
                self.started[ev.request_id] = t0
            tensors = {"codes": ev.codes} if ev.codes is not None else {}
            self.frames += ev.codes is not None
            outs.append(StageMessage(ev.request_id, tensors, meta, last=ev.finished))
        return outs
