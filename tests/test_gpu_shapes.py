"""Every graph shape on CUDA through ``deploy/graph-gpu.yaml`` (side ASR off: GPU hosts may lack the Whisper
weights), in-process and in stage processes; greedy fp32 tokens on CUDA equal the CPU's for Qwen3-Omni small.
Skipped without a CUDA device; ``bash scripts/device_check.sh`` runs them where one is lent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from omniduplex.app.host.pipeline import make_backend
from omniduplex.models.checkpoint import read_config
from omniduplex.models.preset_cache import cached_checkpoint
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.qwen3_tts.config import TTSConfig
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import load_graph
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions, UtteranceRequest
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.topology import QWEN3_TTS, output_rate

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]

ROOT = Path(__file__).resolve().parents[1]
GPU_GRAPH = ROOT / "deploy" / "graph-gpu.yaml"
QUESTION = ROOT / "examples" / "question.wav"
TURN_TIMEOUT_S = 60
GREEDY = {
    "sampling": {"temperature": 0.0, "max_tokens": 10},
    "talker_sampling": {"temperature": 0.0, "max_tokens": 24},
}
SHAPES = [("qwen3-omni", "tiny"), ("qwen3-omni", "small"), ("unified", "small"), ("qwen3-tts", "small")]


def gpu_graph(model: Path, dtype: str | None = None):
    """``graph-gpu.yaml`` for ``model`` without the side ASR; ``dtype`` overrides every CUDA stage's."""
    pcfg = load_graph(GPU_GRAPH, model=str(model))
    pcfg.side_asr = None
    if dtype:
        pcfg.stages = {s: c.model_copy(update={"dtype": dtype}) if c.device == "cuda" else c
                       for s, c in pcfg.stages.items()}
    return pcfg


def _start(pcfg, model: Path):
    """``start(orch) -> request id`` of one short turn (an utterance on the Qwen3-TTS graph)."""
    if pcfg.topology() is QWEN3_TTS:
        cfg = TTSConfig.from_dict(read_config(model))
        sampling = {"max_tokens": 8, "ignore_eos": True, "seed": 0}
        voice = TurnOptions(voice=sorted(cfg.speakers)[0], sampling=sampling)
        return lambda o: o.speak(UtteranceRequest(text="Hello there, how are you?", turn=voice))
    meta = TurnOptions(**GREEDY, max_text_tokens=4, max_audio_frames=12, cfg_scale=2.0)
    wav = load_audio(QUESTION)
    return lambda o: o.submit(wav, meta)


def run_turn(pcfg, model: Path, processes: bool, record: bool = False):
    """One turn on ``pcfg``'s graph: ``(events, turn record or None, the backend)``."""
    tts = pcfg.topology() is QWEN3_TTS
    backend = make_backend(pcfg, processes)
    orch = Orchestrator(backend, None if tts else load_tokenizer(model), record=record,
                        output_rate=output_rate(model))
    start = _start(pcfg, model)

    async def turn():
        rid = start(orch)
        events, rec = [], None
        async for ev in orch.events(rid):
            events.append(ev)
            if ev.kind == "done" and record:
                rec = orch.turn_record(rid)
        return events, rec

    async def main():
        await orch.start()
        try:
            return await asyncio.wait_for(turn(), TURN_TIMEOUT_S)
        finally:
            await orch.stop()

    events, rec = asyncio.run(main())
    return events, rec, backend


def _assert_spoke(events) -> None:
    assert events and events[-1].kind == "done", [e.error for e in events if e.kind == "error"]
    assert sum(e.pcm.size for e in events if e.kind == "audio") > 0


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
@pytest.mark.parametrize(("arch", "preset"), SHAPES, ids=[f"{a}-{p}" for a, p in SHAPES])
def test_shape_runs_on_cuda(arch, preset, processes):
    model = cached_checkpoint(arch, preset)
    events, _, backend = run_turn(gpu_graph(model), model, processes)
    _assert_spoke(events)
    if not processes:  # every engine's KV cache is on the GPU
        engines = [w.engine for w in backend.workers.values() if hasattr(w, "engine")]
        assert engines and all(e.kv[0][0].is_cuda for e in engines)


def test_greedy_fp32_tokens_on_cuda_equal_the_cpus(monkeypatch):
    """Qwen3-Omni small, fp32, greedy: the Thinker's ids and the Talker's codes on CUDA are the CPU's
    (TF32 off: full fp32 matmuls and convolutions on both)."""
    monkeypatch.setenv("OMNIDUPLEX_CPU_OPS", "0")  # the CPU side on plain torch: no C++ build on a GPU host
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    model = cached_checkpoint("qwen3-omni", "small")
    cpu = load_graph(None, model=str(model))  # the shipped CPU graph: every stage fp32 on the CPU
    cpu.side_asr = None
    _, ref, _ = run_turn(cpu, model, processes=False, record=True)
    events, got, _ = run_turn(gpu_graph(model, "float32"), model, processes=False, record=True)
    _assert_spoke(events)
    assert len(ref["text_token_ids"]) > 0 and len(ref["codes"]) > 0
    assert got["text_token_ids"] == ref["text_token_ids"]
    assert got["codes"] == ref["codes"]


def test_cascade_llm_stage_on_cuda(tmp_path):
    """The cascade's LLM stage (our engine) on CUDA, on a tiny random text checkpoint with a ChatML template
    (the packaged SmolLM2 weights are too large to carry to a GPU host)."""
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.llm import LLMWorker

    d = write_checkpoint(tmp_path / "text", "tiny", seed=1, text_only=True)
    (d / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model = load_model(d, parts=("thinker",), dtype=torch.bfloat16, device="cuda")
    w = LLMWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256))
    sampling = {"max_tokens": 6, "top_k": 5, "ignore_eos": True}
    hello = Transcript(transcript="hello there", turn=TurnOptions(sampling=sampling))
    w.submit(StageMessage("t1", {}, hello, last=True))
    outs = []
    for _ in range(100):
        if not w.has_work():
            break
        outs += w.step()
    assert w.engine.kv[0][0].is_cuda
    assert outs[-1].last and len(outs) == 6
    assert all(0 <= int(o.tensors["token"]) < model.thinker.lm_head.weight.shape[0] for o in outs)


def test_cascade_llm_stage_on_cuda_with_real_weights(tmp_path):
    """SmolLM2-135M-Instruct (the packaged cascade LLM) answers on CUDA, when its weight package is
    installed on this host."""
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.registry import load_model
    from omniduplex.models.weights import SMOLLM2_135M, WeightsError, locate
    from omniduplex.pipeline.stages.engine_build import EngineSettings
    from omniduplex.pipeline.stages.llm import LLMWorker

    try:
        src = locate(SMOLLM2_135M)
    except WeightsError as e:
        pytest.skip(f"cascade LLM weights not on this host: {e}")
    model = load_model(cached_import(src, tmp_path / "gguf"), parts=("thinker",), dtype=torch.bfloat16,
                       device="cuda")
    w = LLMWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256))
    opts = TurnOptions(sampling={"max_tokens": 24, "temperature": 0.0})
    ask = Transcript(transcript="What is the capital of France?", turn=opts)
    w.submit(StageMessage("t1", {}, ask, last=True))
    outs = []
    for _ in range(200):
        if not w.has_work():
            break
        outs += w.step()
    assert "Paris" in "".join(o.meta.text or "" for o in outs)
