"""Every stage kind, declared once: its name, the message kinds it emits, the checkpoint parts it loads,
whether it runs its model on our engine, and (attached by :mod:`omniduplex.pipeline.workers`) the builder of
its worker.

The graph shapes (:mod:`omniduplex.pipeline.topology`) chain these names, the graph YAML
(:mod:`omniduplex.pipeline.config`) accepts them, the workers are built from their rows
(:func:`omniduplex.pipeline.workers.build_worker`), and both backends check each output message against its
stage's ``outputs`` (a stage that sends another kind fails that turn, naming itself). A new stage kind is one
:func:`declare` call here (or in a plugin, :mod:`omniduplex.pipeline.runtime.plugins`) and one ``@builds``
builder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omniduplex.pipeline.messages import (
    AudioOutput,
    DecoderOutput,
    Encoded,
    Meta,
    PartialTranscript,
    StageMessage,
    Transcript,
)


@dataclass
class StageKind:
    """One stage kind.

    Attributes:
        name: the stage's name in graphs, the YAML and the process titles.
        outputs: the message kinds its worker emits (:mod:`omniduplex.pipeline.messages`).
        parts: the checkpoint parts it loads (``load_model(parts=...)``; empty: it loads its own files).
        engine: it runs its decoder on our engine (its weights are prepacked for CPU matmuls at load).
        build: ``StageBuild -> StageWorker`` (set by ``@builds``; ``None`` until :mod:`.workers` is loaded).
    """

    name: str
    outputs: tuple[type[Meta], ...]
    parts: tuple[str, ...] = ()
    engine: bool = False
    build: Callable[[Any], Any] | None = field(default=None, repr=False)

    def check_output(self, msg: StageMessage) -> str | None:
        """Why ``msg`` cannot be this stage's output (its meta is not of :attr:`outputs`), else ``None``."""
        if isinstance(msg.meta, self.outputs):
            return None
        allowed = " or ".join(k.__name__ for k in self.outputs)
        return f"{self.name}: sent {type(msg.meta).__name__}, its outputs are {allowed}"


STAGE_KINDS: dict[str, StageKind] = {}
"""Stage name → its declaration."""


def declare(kind: StageKind) -> StageKind:
    """Register ``kind``.

    Raises:
        ValueError: a kind of that name is already declared.
    """
    if kind.name in STAGE_KINDS:
        raise ValueError(f"stage kind {kind.name!r} is already declared")
    STAGE_KINDS[kind.name] = kind
    return kind


def builds(name: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Decorator: the function builds the worker of stage kind ``name``.

    Raises:
        KeyError: no stage kind ``name`` is declared.
    """

    def attach(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        STAGE_KINDS[name].build = fn
        return fn

    return attach


for _kind in (
    StageKind("encoder", (Encoded,), parts=("audio_tower",)),
    StageKind("thinker", (DecoderOutput,), parts=("thinker",), engine=True),
    StageKind("talker", (DecoderOutput,), parts=("talker",), engine=True),
    StageKind("code2wav", (AudioOutput,), parts=("code2wav",)),
    StageKind("codec_encoder", (Encoded,), parts=("codec_encoder",)),
    StageKind("unified", (DecoderOutput,), parts=("unified",), engine=True),
    StageKind("codec", (AudioOutput,), parts=("codec",)),
    StageKind("asr", (Transcript, PartialTranscript)),
    StageKind("llm", (DecoderOutput,)),
    StageKind("tts", (AudioOutput,)),
    StageKind("tts_talker", (DecoderOutput,)),
    StageKind("tts_codec", (AudioOutput,)),
):
    declare(_kind)
