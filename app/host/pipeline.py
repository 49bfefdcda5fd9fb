"""The pipeline factory every entry point shares (the server's host, ``omniduplex respond``, the LiveKit
in-process plugin, the benchmarks): which model runs by default (the cascade on the packaged real weights),
the orchestrator over either backend, and the per-turn meta of each graph shape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.models.weights import cache_dir
from omniduplex.pipeline.messages import TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT
from omniduplex.pipeline.topology import CASCADE, QWEN3_TTS, UNIFIED, output_rate

CASCADE_SYSTEM_PROMPT = SPOKEN_SYSTEM_PROMPT
"""The cascade's default system prompt: replies for the ear (:mod:`omniduplex.pipeline.text.spoken`)."""
CASCADE_SAMPLING = {"temperature": 0.0, "repetition_penalty": 1.1}
"""Greedy replies (temperature 0: the most likely token every step), which a listener can trust for facts
and which repeat the same answer to the same question (issue 40; sampled replies of the small models named
wrong answers beside right ones), with a mild repetition penalty on the generated tokens (CTRL, Keskar et
al. 2019) so that a greedy small model does not loop. A request's own ``temperature`` / ``top_p`` (the
Chat Completions fields) samples instead."""


def default_model() -> Path:
    """The default model: the cascade manifest of the packaged weights (:mod:`omniduplex.models.weights`).

    Raises:
        WeightsError: a weight package is missing or corrupted (one line naming the fix).
    """
    from omniduplex.models.cascade.manifest import default_manifest

    return default_manifest(cache_dir())


def tiny_model() -> Path:
    """The tiny random Qwen3-Omni checkpoint, written on first use (deterministic, so concurrent writers
    agree): the model of the pipeline tests; ``--model tiny`` selects it."""
    from omniduplex.models.qwen3_omni.presets import write_checkpoint

    d = cache_dir() / "tiny"
    if not (d / "model.safetensors").is_file():
        tmp = d.with_name(f"tiny.tmp{os.getpid()}")
        write_checkpoint(tmp, "tiny")
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(d)
        except OSError:  # another process won the race
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return d


def resolve_model(model: str | Path | None) -> str:
    """``None`` (or ``"default"``, or ``"quality"``, its name before it was the default) →
    :func:`default_model` (the cascade with Qwen2.5-Coder-1.5B); ``"tiny"`` → :func:`tiny_model`;
    ``"fast"`` → the cascade with Qwen2.5-Coder-0.5B
    (:func:`~omniduplex.models.cascade.manifest.fast_manifest`); ``"small"`` → the cascade with SmolLM2-135M
    (:func:`~omniduplex.models.cascade.manifest.small_manifest`); anything else as given.

    Raises:
        WeightsError: the weights a name needs are missing or corrupted (one line naming the fix).
    """
    if model is None or str(model) in ("default", "quality"):
        return str(default_model())
    if str(model) == "tiny":
        return str(tiny_model())
    if str(model) in ("fast", "small"):
        from omniduplex.models.cascade.manifest import fast_manifest, small_manifest

        return str((fast_manifest if str(model) == "fast" else small_manifest)(cache_dir()))
    return str(model)


def new_orchestrator(pcfg, processes: bool, record: bool = False, **start) -> Orchestrator:
    """An :class:`Orchestrator` over the stages of ``pcfg.model`` (processes or in-process); the cascade's
    LLM stage sends its own text deltas, the other shapes are detokenized with their tokenizer. ``start``:
    ``start_timeout_s`` / ``wait_when_late`` of the stage processes (:func:`make_backend`).

    Raises:
        ValueError: ``pcfg.model`` is a Qwen3-TTS checkpoint (text to speech: it cannot hold a conversation).
    """
    topo = pcfg.topology()
    if topo.name == QWEN3_TTS.name:
        raise ValueError(
            f"{pcfg.model} is a Qwen3-TTS checkpoint (text to speech), not a conversation model: give it as "
            "the cascade's voice (init-cascade --tts) or serve it for POST /v1/audio/speech (serve --tts)"
        )
    return Orchestrator(
        make_backend(pcfg, processes, **start),
        None if topo.name == CASCADE.name else load_tokenizer(pcfg.model),
        record=record,
        output_rate=output_rate(pcfg.model),
        side_transcript=bool(topo.side),
    )


def make_backend(pcfg, processes: bool, **start):
    """Stage processes joined by the relay (default), or all stages in this process. ``start``: how the stage
    processes start (``start_timeout_s``, ``wait_when_late``: ``pipeline.process_backend.ProcessBackend``)."""
    if processes:
        from omniduplex.pipeline.runtime.process_backend import ProcessBackend

        return ProcessBackend(pcfg, **start)
    from omniduplex.pipeline.runtime.local_backend import LocalBackend
    from omniduplex.pipeline.workers import build_all

    return LocalBackend(build_all(pcfg), pcfg.topology())


@dataclass
class RespondOptions:
    """Per-turn options of ``respond``. ``user_text``, ``cfg_scale`` and ``max_audio_frames`` apply to unified
    checkpoints (``max_tokens`` is their text budget), ``talker_max_tokens`` and ``speaker`` to Qwen3-Omni."""

    greedy: bool = False
    max_tokens: int = 64
    system_prompt: str | None = None
    talker_max_tokens: int = 128
    speaker: str = "ethan"
    user_text: str | None = None
    cfg_scale: float = 1.0
    max_audio_frames: int = 64

    def meta(self, shape: str) -> TurnOptions:
        """The turn's pipeline options for a graph of ``shape`` (see :meth:`Orchestrator.submit`)."""
        if shape == CASCADE.name:
            sampling = {"max_tokens": self.max_tokens, **CASCADE_SAMPLING}
            if self.greedy:
                sampling.update(temperature=0.0, repetition_penalty=1.0)
            return TurnOptions(sampling=sampling, system_prompt=self.system_prompt or CASCADE_SYSTEM_PROMPT)
        if shape == UNIFIED.name:
            return TurnOptions(
                user_text=self.user_text or "",
                max_text_tokens=self.max_tokens,
                max_audio_frames=self.max_audio_frames,
                cfg_scale=self.cfg_scale,
                sampling={"temperature": 0.0 if self.greedy else 0.8},
            )
        sampling = {"max_tokens": self.max_tokens}
        talker = {"max_tokens": self.talker_max_tokens}
        if self.greedy:
            sampling["temperature"] = 0.0
            talker["temperature"] = 0.0
        else:
            sampling.update(temperature=0.7, top_p=0.8, top_k=20)  # Qwen3-Omni model-card defaults
        return TurnOptions(sampling=sampling, talker_sampling=talker, speaker=self.speaker)


def serving_meta(
    max_tokens: int,
    talker_max_tokens: int,
    *,
    ignore_eos: bool = False,
    cfg_scale: float = 1.0,
    speaker: str = "ethan",
    shape: str = "qwen3-omni",
    system_prompt: str | None = None,
) -> TurnOptions:
    """Turn options for a server or benchmark serving a graph of ``shape``. Cascade: SmolLM2 sampling
    (:data:`CASCADE_SAMPLING`), ``max_tokens`` reply tokens, the system prompt. Otherwise Qwen3-Omni
    model-card sampling for the Thinker, ``max_tokens`` text / ``talker_max_tokens`` codec frames as the
    budgets of both speech-LM shapes, ``cfg_scale`` for unified checkpoints (see
    :meth:`Orchestrator.submit`)."""
    if shape == CASCADE.name:
        sampling = {"max_tokens": max_tokens, "ignore_eos": ignore_eos, **CASCADE_SAMPLING}
        return TurnOptions(sampling=sampling, system_prompt=system_prompt or CASCADE_SYSTEM_PROMPT)
    return TurnOptions(**{
        "sampling": {
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "ignore_eos": ignore_eos,
        },
        "talker_sampling": {"max_tokens": talker_max_tokens, "ignore_eos": ignore_eos},
        "speaker": speaker,
        # unified checkpoints: the same budgets, plus CFG
        "max_text_tokens": max_tokens,
        "max_audio_frames": talker_max_tokens,
        "cfg_scale": cfg_scale,
    })
