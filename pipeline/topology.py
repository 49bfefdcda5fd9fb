"""The four stage-graph shapes: which stages a model runs, in what order, and what each edge carries.

A turn enters the first stage from the orchestrator and moves down the chain; the stages in
``to_orchestrator`` also report to it (transcript tokens, codec frames, PCM). The last stage emits PCM
and its ``last`` message ends the turn. Both backends (in-process and stage processes) route by the
same :class:`Topology`, picked from the checkpoint's ``architectures`` or the cascade manifest
(:func:`topology_for`).

* ``qwen3-omni``: ``encoder → thinker → talker → code2wav`` (shape 1).
* ``unified``: ``codec_encoder → unified → codec`` (shape 2): the DAC encoder turns the user's speech
  into delay-pattern codec steps of the prompt, the unified LM writes text then speaks (CFG pairs in its
  engine), the DAC decoder streams the waveform.
* ``cascade``: ``asr → llm → tts`` (shape 3, :mod:`omniduplex.models.cascade.manifest`): Whisper transcribes
  the turn (the transcript also goes to the orchestrator: user captions and history), the text LLM streams
  its reply tokens with their text, Piper speaks it clause by clause; each PCM chunk carries the text it
  speaks (the alignment used to truncate an interrupted reply).
* ``qwen3-tts``: ``tts_talker → tts_codec`` (shape 4): text to speech alone, for a Qwen3-TTS checkpoint. The
  talker stage builds each utterance's prompt (text + voice, meta of the turn's message) and runs the talker
  and code predictor on our engine; the codec stage streams the 12 Hz decoder, one state per utterance, and
  decodes the chunks that several utterances complete in one batched call.
"""


from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from omniduplex.models.cascade.manifest import is_cascade
from omniduplex.models.checkpoint import read_config
from omniduplex.models.qwen3_tts.config import ARCHITECTURE as QWEN3_TTS_ARCHITECTURE
from omniduplex.pipeline.stages.kinds import STAGE_KINDS

ORCHESTRATOR = "orchestrator"
QWEN3_OMNI_OUTPUT_RATE = 24_000
"""Code2Wav output rate (Hz), Qwen3-Omni model card."""


@dataclass(frozen=True)
class Topology:
    """One graph shape.

    Attributes:
        name: ``qwen3-omni``, ``unified``, ``cascade`` or ``qwen3-tts``.
        stages: stage names in chain order; ``stages[0]`` takes turns, ``stages[-1]`` emits PCM.
        to_orchestrator: stages with an edge back to the orchestrator.
        edge_tensors: ``(producer, consumer)`` → names of the tensors that travel on that edge
            (``None`` = all of them; ``()`` = none: only the message's meta travels).
        side: stages off the chain that also take every turn from the orchestrator and report only to it
            (the side ASR of :func:`with_side_asr`); a turn ends when the audio stage *and* every side
            stage have sent their ``last`` message.
    """

    name: str
    stages: tuple[str, ...]
    to_orchestrator: frozenset[str]
    edge_tensors: dict[tuple[str, str], tuple[str, ...] | None]
    side: tuple[str, ...] = ()

    @property
    def all_stages(self) -> tuple[str, ...]:
        """Chain stages, then side stages: every stage process of the graph."""
        return self.stages + self.side

    @property
    def entry_stages(self) -> tuple[str, ...]:
        """The stages the orchestrator sends each new turn to."""
        return (self.first, *self.side)

    @property
    def terminal_stages(self) -> frozenset[str]:
        """The stages whose ``last`` message a turn waits for before it is done."""
        return frozenset((self.audio_stage, *self.side))

    @property
    def first(self) -> str:
        return self.stages[0]

    @property
    def audio_stage(self) -> str:
        return self.stages[-1]

    def downstream(self, stage: str) -> str | None:
        if stage in self.side:
            return None
        i = self.stages.index(stage)
        return self.stages[i + 1] if i + 1 < len(self.stages) else None

    def upstream(self, stage: str) -> str:
        if stage in self.side:
            return ORCHESTRATOR
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
CASCADE = Topology(
    name="cascade",
    stages=("asr", "llm", "tts"),
    to_orchestrator=frozenset({"asr", "llm", "tts"}),
    edge_tensors={
        (ORCHESTRATOR, "asr"): None,
        ("asr", "llm"): (),
        ("asr", ORCHESTRATOR): (),
        ("llm", "tts"): ("token",),  # a message needs a tensor on its edge to travel (stage_process)
        ("llm", ORCHESTRATOR): ("token", "prompt_ids"),
        ("tts", ORCHESTRATOR): ("pcm",),
    },
)
QWEN3_TTS = Topology(
    name="qwen3-tts",
    stages=("tts_talker", "tts_codec"),
    to_orchestrator=frozenset({"tts_codec"}),
    edge_tensors={
        (ORCHESTRATOR, "tts_talker"): ("ref_audio",),  # the text and voice travel in the meta
        ("tts_talker", "tts_codec"): ("codes",),
        ("tts_codec", ORCHESTRATOR): ("pcm",),
    },
)
SHAPES = (QWEN3_OMNI, UNIFIED, CASCADE, QWEN3_TTS)
_undeclared = {s for t in SHAPES for s in t.stages} - set(STAGE_KINDS)
assert not _undeclared, f"graph shapes chain undeclared stage kinds {_undeclared}"
CASCADE_OUTPUT_RATE = 24_000
"""Rate the TTS stage resamples Piper's voice to (Hz): the same as Code2Wav and the Realtime API's PCM."""


def with_side_asr(topo: Topology) -> Topology:
    """``topo`` plus the ASR stage beside its chain: it transcribes each turn's waveform for user captions,
    history and the APIs while the speech LM answers from the audio itself. The cascade has ASR in its
    chain already and is returned unchanged."""
    if "asr" in topo.stages:
        return topo
    return replace(
        topo,
        side=("asr",),
        to_orchestrator=topo.to_orchestrator | {"asr"},
        edge_tensors={**topo.edge_tensors, (ORCHESTRATOR, "asr"): ("waveform",), ("asr", ORCHESTRATOR): ()},
    )


def _family(raw: dict):
    """The registered model family (``models.registry.ModelFamily``) of a ``config.json``, else ``None``."""
    from omniduplex.models.registry import model_family_of  # local: the model modules load on first use

    archs = raw.get("architectures") or []
    return model_family_of(archs[0]) if archs else None


def topology_for(model: str | Path) -> Topology:
    """:data:`CASCADE` for a cascade manifest, :data:`QWEN3_TTS` for a Qwen3-TTS checkpoint, else the shape
    its registered model family declares (``ModelFamily.shape``: :data:`UNIFIED` for ``OmniduplexUnifiedLM``),
    :data:`QWEN3_OMNI` for an architecture no family reads (loading it then names the supported ones).

    Raises:
        CheckpointError: ``config.json`` missing or unreadable.
        ValueError: a family declares a shape that is not in :data:`SHAPES`.
    """
    if is_cascade(model):
        return CASCADE
    raw = read_config(model)
    if QWEN3_TTS_ARCHITECTURE in (raw.get("architectures") or []):
        return QWEN3_TTS
    family = _family(raw)
    if family is None:
        return QWEN3_OMNI
    shape = next((t for t in SHAPES if t.name == family.shape), None)
    if shape is None:
        raise ValueError(f"model family {family.name}: unknown shape {family.shape!r}; "
                         f"choose from {[t.name for t in SHAPES]}")
    return shape


def output_rate(model: str | Path) -> int:
    """Sample rate (Hz) of the PCM the graph of ``model`` emits: 24 kHz for the cascade's TTS, Qwen3-TTS and
    Code2Wav, else what the model family declares (``ModelFamily.output_rate``: the DAC
    ``codec_config.sampling_rate`` for unified checkpoints)."""
    if is_cascade(model):
        return CASCADE_OUTPUT_RATE
    raw = read_config(model)
    family = _family(raw)
    if family is not None and family.output_rate is not None:
        return family.output_rate(raw)
    return QWEN3_OMNI_OUTPUT_RATE
