"""The typed stage contract: every worker class implements :class:`StageWorker`, and every stage kind of every
graph shape has a builder in the table."""

import importlib
import inspect
import pkgutil

import pytest

import omniduplex.pipeline.stages as stages
from omniduplex.pipeline.config import ChunkingConfig, StageConfig
from omniduplex.pipeline.stages.contract import StageWorker
from omniduplex.pipeline.topology import SHAPES, with_side_asr
from omniduplex.pipeline.workers import BUILDERS, build_worker


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


def test_every_stage_kind_has_a_builder():
    kinds = {s for t in SHAPES for s in with_side_asr(t).all_stages}
    assert kinds == set(BUILDERS)


def test_unknown_stage_kind_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no stage kind 'nope'"):
        build_worker("nope", tmp_path, StageConfig(), ChunkingConfig())
