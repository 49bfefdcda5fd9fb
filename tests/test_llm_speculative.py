"""Speculative decoding in the cascade LLM stage, on the real SmolLM2-135M-Instruct weights: the same replies
(text and ids) as without it, with prompt lookup and with a draft model, beside a tool-call turn (grammar:
not speculated) in the same batch; the manifest's ``llm_speculative`` knob reaches the stage's engine."""

from __future__ import annotations

import pytest
import torch
from tool_models import bench_tools, one_thread, smollm2_dir  # noqa: F401 (fixture)

from omniduplex.models.cascade.manifest import load_manifest, write_manifest
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.registry import load_model
from omniduplex.pipeline.config import StageConfig
from omniduplex.pipeline.engine.speculative import SpeculativeConfig
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.llm import LLMWorker
from omniduplex.pipeline.stages.llm_speculative import make_speculator
from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")

SHORT = {"max_tokens": 24}
SPOKEN = TurnOptions(system_prompt=SPOKEN_SYSTEM_PROMPT, sampling=SHORT)
TURNS = {
    "a": "Please repeat after me: the quick brown fox jumps over the lazy dog, the quick brown fox.",
    "b": "List the days of the week.",
    "c": "What is the capital of France?",
}


@pytest.fixture(scope="module")
def model():
    return load_model(smollm2_dir(), parts=("thinker",))


def replies(worker: LLMWorker) -> dict[str, tuple[list[int], str, list]]:
    """Run the three turns and a forced tool call together; per turn its ids, its text and its call events."""
    for rid, text in TURNS.items():
        worker.submit(
            StageMessage(
                rid,
                {},
                Transcript(turn=SPOKEN, transcript=text),
            )
        )
    worker.submit(
        StageMessage(
            "tool",
            {},
            Transcript(
                turn=TurnOptions(tools=bench_tools(), tool_choice="required", sampling=SHORT),
                transcript="What's the weather like in Paris right now?",
            ),
        )
    )
    out: dict[str, tuple[list[int], str, list]] = {rid: ([], "", []) for rid in [*TURNS, "tool"]}
    for _ in range(800):
        if not worker.has_work():
            break
        for m in worker.step():
            ids, text, calls = out[m.request_id]
            events = [(type(e).__name__, e.name if hasattr(e, "name") else "") for e in m.meta.calls]
            done = [e.arguments for e in m.meta.calls if hasattr(e, "arguments")]  # ids are random
            calls = calls + events + done
            out[m.request_id] = (ids + m.tensors["token"].tolist(), text + (m.meta.text or ""), calls)
    assert not worker.has_work() and not worker.engine.has_unfinished()
    return out


def _worker(model, spec=None, draft=None) -> LLMWorker:
    sizes = EngineSettings(num_blocks=256, max_num_seqs=4, max_num_batched_tokens=512)
    return LLMWorker(model, sizes, speculative=spec, draft=draft)


@pytest.mark.slow
def test_replies_are_the_same_with_prompt_lookup_and_with_a_draft_model(model):
    plain = replies(_worker(model))
    assert plain["tool"][2]  # the forced call streamed
    ngram = _worker(model, SpeculativeConfig("ngram", k=4))
    assert replies(ngram) == plain
    spec = ngram.engine.spec
    assert 0 < spec.num_accepted < spec.num_drafted
    drafted = _worker(
        model,
        SpeculativeConfig("draft", k=3, draft="smollm2"),
        draft=load_model(smollm2_dir(), parts=("thinker",)),
    )
    assert replies(drafted) == plain
    spec = drafted.engine.spec
    assert spec.num_accepted >= 0.9 * spec.num_drafted > 0  # the same model as its own draft agrees
    stats = drafted.stats()
    assert (
        stats["spec_accepted_tokens"] == spec.num_accepted and stats["spec_draft_tokens"] == spec.num_drafted
    )


def test_a_draft_of_another_vocabulary_is_refused(model, tmp_path):
    from omniduplex.models.qwen3_omni.presets import write_checkpoint

    other = load_model(write_checkpoint(tmp_path, "tiny", seed=1, text_only=True), parts=("thinker",))
    worker = _worker(model)
    with pytest.raises(ValueError, match="272 logits, the LLM has"):
        make_speculator(
            SpeculativeConfig("draft", 2, "x"),
            other,
            worker.tokenizer,
            model.thinker.cfg.vocab_size,
            (8, 1, 64),
            torch.float32,
            "cpu",
        )


def _manifest(tmp_path, spec) -> object:
    voice = tmp_path / "voice.onnx"
    voice.write_bytes(b"")
    (tmp_path / "voice.onnx.json").write_text("{}")
    asr = tmp_path / "asr"
    asr.mkdir(exist_ok=True)
    path = write_manifest(tmp_path / "m", asr, smollm2_dir(), voice, None)
    text = path.read_text()
    path.write_text(text + f"llm_speculative: {spec}\n")
    return path


def test_the_manifest_knob_is_checked_and_reaches_the_engine(model, tmp_path):
    from omniduplex.pipeline.workers import _llm_worker

    m = load_manifest(_manifest(tmp_path, "{method: ngram, k: 3}"))
    assert m.llm_speculative == {"method": "ngram", "k": 3}
    spec = SpeculativeConfig.parse(m.llm_speculative)
    worker = LLMWorker(model, EngineSettings(64, 4, 256), speculative=spec)
    assert worker.engine.spec.config == SpeculativeConfig("ngram", 3)
    # the stage builder checks the knob before it loads any weights
    with pytest.raises(
        ValueError, match=r"m/cascade.yaml: llm_speculative.k must be an integer in \[1, 16\]"
    ):
        _llm_worker(load_manifest(_manifest(tmp_path, "{method: ngram, k: 99}")), StageConfig())
    with pytest.raises(CheckpointError, match="llm_speculative.draft path .*nowhere.gguf does not exist"):
        load_manifest(_manifest(tmp_path, "{method: draft, draft: nowhere.gguf}"))
    with pytest.raises(CheckpointError, match="llm_speculative must be a mapping"):
        load_manifest(_manifest(tmp_path, "ngram"))


@pytest.mark.slow
def test_bench_spec_reports_acceptance_and_speedup_with_identical_replies(tmp_path):
    import json

    from typer.testing import CliRunner

    from omniduplex.cli.main import cli

    smollm2_dir()  # skips when the weights are missing
    out = tmp_path / "spec.json"
    res = CliRunner().invoke(
        cli, ["bench", "spec", "--only", "SmolLM2", "--turns", "1", "--max-tokens", "12", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert [(r["target"], r["proposer"], r["workload"]) for r in rows] == [
        ("SmolLM2-135M", "ngram", "qa"),
        ("SmolLM2-135M", "ngram", "tool"),
    ]
    for r in rows:
        assert r["same"] is True and 0 <= r["acceptance"] <= 1 and r["tok_s"] > 0 and r["spec_tok_s"] > 0
    assert "speedup" in res.output and "SmolLM2-135M" in res.output
