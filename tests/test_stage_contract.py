"""The typed stage contract: every worker class implements :class:`StageWorker`, every stage kind of every
graph shape is declared once with a builder, and a stage that emits a kind it does not declare fails that
turn (naming the stage) while the next turn goes through."""

import importlib
import inspect
import pkgutil
import threading

import pytest
import torch

import omniduplex.pipeline.stages as stages
from omniduplex.pipeline.config import ChunkingConfig, StageConfig
from omniduplex.pipeline.messages import (
    AudioOutput,
    DecoderOutput,
    StageError,
    StageMessage,
    Transcript,
    TurnRequest,
)
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.stages.contract import BatchGauges, StageWorker
from omniduplex.pipeline.stages.kinds import STAGE_KINDS, StageKind, declare
from omniduplex.pipeline.topology import CASCADE, SHAPES, with_side_asr
from omniduplex.pipeline.workers import build_worker


def worker_classes() -> list[type]:
    found = []
    for m in pkgutil.iter_modules(stages.__path__):
        mod = importlib.import_module(f"{stages.__name__}.{m.name}")
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__ and name.endswith("Worker") and cls is not StageWorker:
                found.append(cls)
    return found


def test_every_stage_module_worker_is_found():
    names = {c.__name__ for c in worker_classes()}
    assert {"ASRWorker", "LLMWorker", "TTSWorker", "VocoderWorker", "VLLMLLMWorker"} <= names
    assert {"EngineTTSStageWorker", "RunnerTTSStageWorker", "Qwen3TTSStageWorker"} <= names
    assert len(names) == 16


@pytest.mark.parametrize("cls", worker_classes(), ids=lambda c: c.__name__)
def test_worker_class_implements_the_stage_contract(cls):
    members = [n for n in StageWorker.__dict__ if not n.startswith("_")]
    assert set(members) == {"submit", "abort", "has_work", "step", "stats", "pop_errors", "close"}
    for name in members:
        impl = getattr(cls, name, None)
        assert callable(impl), f"{cls.__name__} lacks {name}"
        want = list(inspect.signature(getattr(StageWorker, name)).parameters)
        got = list(inspect.signature(impl).parameters)
        assert got[: len(want)] == want, f"{cls.__name__}.{name}{got} is not {name}{want}"


def test_every_stage_kind_is_declared_once_with_a_builder():
    kinds = {s for t in SHAPES for s in with_side_asr(t).all_stages}
    assert kinds == set(STAGE_KINDS)
    assert all(k.build is not None and k.outputs for k in STAGE_KINDS.values())
    with pytest.raises(ValueError, match="already declared"):
        declare(StageKind("llm", ()))


def test_the_graph_yaml_accepts_only_declared_stages():
    from omniduplex.pipeline.config import PipelineConfig

    assert PipelineConfig(stages={"llm": {}}).stage("llm").max_num_seqs >= 1
    with pytest.raises(ValueError, match="stages.nope: unknown stage"):
        PipelineConfig(stages={"nope": {}})


def test_unknown_stage_kind_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no stage kind 'nope'"):
        build_worker("nope", tmp_path, StageConfig(), ChunkingConfig())


class _Echo(BatchGauges):
    """Answers each message at once with ``make(msg)`` (a stage that may send the wrong kind)."""

    max_batch = 8

    def __init__(self, make):
        self.pending, self.make = [], make

    def submit(self, msg):
        self.pending.append(msg)

    def abort(self, request_id):
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self):
        return bool(self.pending)

    def step(self):
        out, self.pending = self.pending, []
        return [StageMessage(m.request_id, {"token": torch.zeros(0, dtype=torch.int64)}, self.make(m), True)
                for m in out]


def test_a_stage_that_sends_a_kind_it_does_not_declare_fails_that_turn_only():
    events: dict[str, list] = {}
    done = threading.Event()

    def on_output(msg):
        events.setdefault(msg.request_id, []).append(msg.meta)
        if len(events) == 2 and all(isinstance(v[-1], StageError | AudioOutput) for v in events.values()):
            done.set()

    def llm(msg):  # turn "bad" gets an audio stage's kind from the LLM
        return AudioOutput(text="x") if msg.request_id == "bad" else DecoderOutput(text="hi")

    workers = {
        "asr": _Echo(lambda m: Transcript(transcript="hello")),
        "llm": _Echo(llm),
        "tts": _Echo(lambda m: AudioOutput(text=m.meta.text)),
    }
    backend = LocalBackend(workers, CASCADE)
    backend.start(on_output)
    try:
        for rid in ("bad", "good"):
            backend.send(StageMessage(rid, {"waveform": torch.zeros(1600)}, TurnRequest(), last=True))
        assert done.wait(60)
    finally:
        backend.stop()
    err = events["bad"][-1]
    assert isinstance(err, StageError) and err.stage == "llm" and "sent AudioOutput" in err.error
    assert isinstance(events["good"][-1], AudioOutput) and events["good"][-1].text == "hi"
