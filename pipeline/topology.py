"""The two stage-graph shapes: which stages a checkpoint runs, in what order, and what each edge carries.

A turn enters the first stage from the orchestrator and moves down the chain; the stages in
``to_orchestrator`` also report to it (transcript tokens, codec frames, PCM). The last stage emits PCM
and its ``last`` message ends the turn. Both backends (in-process and stage processes) route by the
same :class:`Topology`, picked from the checkpoint's ``architectures`` (:func:`topology_for`).

* ``qwen3-omni``: ``encoder → thinker → talker → code2wav`` (DESIGN.md shape 1).
* ``unified``: ``codec_encoder → unified → codec`` (shape 2): the DAC encoder turns the user's speech
  into delay-pattern codec steps of the prompt, the unified LM writes text then speaks (CFG pairs in its
  engine), the DAC decoder streams the waveform.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omniduplex.models.checkpoint import read_config

ORCHESTRATOR = "orchestrator"
QWEN3_OMNI_OUTPUT_RATE = 24_000
"""Code2Wav output rate (Hz), Qwen3-Omni model card."""


@dataclass(frozen=True)
class Topology:
    """One graph shape.

    Attributes:
        name: ``qwen3-omni`` or ``unified``.
        stages: stage names in chain order; ``stages[0]`` takes turns, ``stages[-1]`` emits PCM.
        to_orchestrator: stages with an edge back to the orchestrator.
        edge_tensors: ``(producer, consumer)`` → names of the tensors that travel on that edge
            (``None`` = all of them).
    """

    name: str
    stages: tuple[str, ...]
    to_orchestrator: frozenset[str]
    edge_tensors: dict[tuple[str, str], tuple[str, ...] | None]

    @property
    def first(self) -> str:
        return self.stages[0]

    @property
    def audio_stage(self) -> str:
        return self.stages[-1]

    def downstream(self, stage: str) -> str | None:
        i = self.stages.index(stage)
        return self.stages[i + 1] if i + 1 < len(self.stages) else None

    def upstream(self, stage: str) -> str:
        i = self.stages.index(stage)
        return self.stages[i - 1] if i else ORCHESTRATOR

    def out_edges(self, stage: str) -> list[str]:
        nxt = self.downstream(stage)
        return ([nxt] if nxt else []) + ([ORCHESTRATOR] if stage in self.to_orchestrator else [])


QWEN3_OMNI = Topology(
    name="qwen3-omni",
    stages=("encoder", "thinker", "talker", "code2wav"),
    to_orchestrator=frozenset({"thinker", "talker", "code2wav"}),
    edge_tensors={
        (ORCHESTRATOR, "encoder"): None,
        ("encoder", "thinker"): None,
        ("thinker", "talker"): None,
        ("thinker", ORCHESTRATOR): ("token", "prompt_ids"),
        ("talker", "code2wav"): None,
        ("talker", ORCHESTRATOR): ("codes",),
        ("code2wav", ORCHESTRATOR): ("pcm",),
    },
)
UNIFIED = Topology(
    name="unified",
    stages=("codec_encoder", "unified", "codec"),
    to_orchestrator=frozenset({"unified", "codec"}),
    edge_tensors={
        (ORCHESTRATOR, "codec_encoder"): None,
        ("codec_encoder", "unified"): None,
        ("unified", "codec"): ("codes",),
        ("unified", ORCHESTRATOR): ("token", "codes"),
        ("codec", ORCHESTRATOR): ("pcm",),
    },
)
ALL_STAGES = tuple(dict.fromkeys(QWEN3_OMNI.stages + UNIFIED.stages))


def topology_for(model_dir: str | Path) -> Topology:
    """:data:`UNIFIED` for an ``OmniduplexUnifiedLM`` checkpoint, else :data:`QWEN3_OMNI`.

    Raises:
        CheckpointError: ``config.json`` missing or unreadable.
    """
    archs = read_config(model_dir).get("architectures") or []
    return UNIFIED if "OmniduplexUnifiedLM" in archs else QWEN3_OMNI


def output_rate(model_dir: str | Path) -> int:
    """Sample rate (Hz) of the PCM the graph of ``model_dir`` emits: 24 kHz for Code2Wav, the DAC
    ``codec_config.sampling_rate`` for unified checkpoints."""
    cfg = read_config(model_dir)
    if "OmniduplexUnifiedLM" in (cfg.get("architectures") or []):
        return int((cfg.get("codec_config") or {}).get("sampling_rate", 16000))
    return QWEN3_OMNI_OUTPUT_RATE
