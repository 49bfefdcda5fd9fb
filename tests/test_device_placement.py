"""Every shape's stages on ``deploy/graph-gpu.yaml`` keep their tensors on the stage's device: checked on the
CPU with a stand-in accelerator (:mod:`device_audit`) that raises where CUDA would raise "Expected all tensors
to be on the same device" or refuse ``.numpy()``. Each turn runs in-process twice: with the tensors passed
between stages as they are (in-process serving) and moved to the host at every hop (the relay lands a tensor
on the host: stage processes).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from device_audit import FAKE, DeviceMismatch, FakeAccelerator

from omniduplex.models.checkpoint import read_config
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.qwen3_tts.config import TTSConfig
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.models.unified.presets import write_unified_checkpoint
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import PipelineConfig, load_graph
from omniduplex.pipeline.messages import (
    PartialTranscript,
    Prefill,
    StageMessage,
    Transcript,
    TurnOptions,
    UtteranceRequest,
)
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.llm import LLMWorker
from omniduplex.pipeline.topology import QWEN3_TTS, output_rate
from omniduplex.pipeline.workers import build_all

ROOT = Path(__file__).resolve().parents[1]
GPU_GRAPH = ROOT / "deploy" / "graph-gpu.yaml"
QUESTION = load_audio(ROOT / "examples" / "question.wav")
REF_AUDIO = (0.1 * np.sin(np.arange(24000) * 0.05)).astype(np.float32)  # 1 s at 24 kHz
TURN_TIMEOUT_S = 300


def test_stand_in_device_raises_where_cuda_does():
    acc = FakeAccelerator()
    with acc:
        lin = torch.nn.Linear(4, 4).to(device="privateuseone")
        dev = torch.zeros(2, 4, device=lin.weight.device)
        host = torch.from_numpy(np.ones((2, 4), np.float32))
        assert lin.weight.device == FAKE and dev.device == FAKE and host.device.type == "cpu"
        with pytest.raises(DeviceMismatch, match="linear"):
            lin(host)
        with pytest.raises(DeviceMismatch, match="numpy"):
            dev.numpy()
        with pytest.raises(DeviceMismatch, match="cat"):
            torch.cat([dev, host])
        assert lin(host.to(dev.device)).device == FAKE  # moved: fine
        assert host.device.type == "cpu"  # .to made a copy on the device, the host tensor stays
        assert (dev + torch.tensor(2.0)).device == FAKE  # a 0-dim host tensor is a scalar
        assert dev[torch.tensor([1, 0])].device == FAKE  # host indices into a device tensor
        dev[0:1] = host[:1]  # a slice assignment is a copy
        with pytest.raises(DeviceMismatch):
            dev[torch.tensor([0])] = host[:1]  # an index_put_ with host values is not
        assert dev.cpu().numpy().shape == (2, 4) and dev.tolist() == [[1.0] * 4, [0.0] * 4]
    assert len(acc.violations) == 4


def _on_stand_in(pcfg: PipelineConfig) -> PipelineConfig:
    """The stages ``graph-gpu.yaml`` puts on CUDA, on the stand-in device instead; no side ASR."""
    moved = {s: c.model_copy(update={"device": "privateuseone"}) for s, c in pcfg.stages.items()
             if c.device == "cuda"}
    assert set(pcfg.topology().stages) <= set(moved), "graph-gpu.yaml must put every torch stage on CUDA"
    pcfg.stages.update(moved)
    pcfg.side_asr = None
    return pcfg


def _land_on_host(workers: dict) -> None:
    """Every message reaches its stage with its tensors on the host, as the relay delivers them."""
    for w in workers.values():
        def submit(msg: StageMessage, _submit=w.submit):
            tensors = {k: v.cpu() for k, v in msg.tensors.items()}
            return _submit(StageMessage(msg.request_id, tensors, msg.meta, msg.last))

        w.submit = submit


def _run_audited(model: Path, starts: list, land_on_host: bool):
    """Build the GPU graph of ``model`` on the stand-in device, run each ``start(orch) -> request id`` to its
    end; returns ``(events per request, the workers, the accelerator)``."""
    acc = FakeAccelerator()
    pcfg = _on_stand_in(load_graph(GPU_GRAPH, model=str(model)))
    with acc:
        workers = build_all(pcfg)
    if land_on_host:
        _land_on_host(workers)
    backend = LocalBackend(workers, pcfg.topology())
    loop = backend._loop

    def audited_loop():  # the mode is thread-local: the backend thread enters it too
        with acc:
            loop()

    backend._loop = audited_loop
    tok = None if pcfg.topology() is QWEN3_TTS else load_tokenizer(model)
    orch = Orchestrator(backend, tok, output_rate=output_rate(model))

    async def turn(start) -> list:
        return [ev async for ev in orch.events(start(orch))]

    async def main():
        await orch.start()
        try:
            return [await asyncio.wait_for(turn(s), TURN_TIMEOUT_S) for s in starts]
        finally:
            await orch.stop()

    with acc:
        events = asyncio.run(main())
    return events, workers, acc


def _omni_turns():
    sampled = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.1, "seed": 1}
    meta = TurnOptions(
        sampling={**sampled, "max_tokens": 6},
        talker_sampling={"temperature": 0.9, "max_tokens": 12, "seed": 2},
        history=[["user", "hi"], ["assistant", "hello"]],
    )
    typed = meta.model_copy(update={"user_text": "hi"})
    return [lambda o: o.submit(QUESTION, meta), lambda o: o.submit(np.zeros(0, np.float32), typed)]


def _unified_turns():
    meta = TurnOptions(max_text_tokens=3, max_audio_frames=10, cfg_scale=2.0, sampling={"temperature": 0.8})
    return [lambda o: o.submit(QUESTION, meta.model_copy(update={"user_text": "hi"}))]


def _tts_turns(model: Path):
    cfg = TTSConfig.from_dict(read_config(model))
    sampling = {"max_tokens": 6, "ignore_eos": True, "seed": 0}
    if cfg.variant == "base":
        opts = TurnOptions(sampling=sampling)
        said = UtteranceRequest(text="Hello there.", ref_text="Hello there.", turn=opts)
        return [lambda o: o.speak(said, REF_AUDIO)]
    voice = TurnOptions(voice=sorted(cfg.speakers)[0], sampling=sampling)
    return [lambda o: o.speak(UtteranceRequest(text="Hello there.", turn=voice))]


SHAPES = {
    "qwen3-omni": (lambda d: write_checkpoint(d, "tiny", seed=4), _omni_turns),
    "unified": (lambda d: write_unified_checkpoint(d, "tiny", seed=3), _unified_turns),
    "qwen3-tts": (lambda d: write_tts_checkpoint(d, "tiny", 0, "custom_voice"), _tts_turns),
    "qwen3-tts-base": (lambda d: write_tts_checkpoint(d, "tiny", 0, "base"), _tts_turns),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: write(tmp_path_factory.mktemp(name)) for name, (write, _) in SHAPES.items()}


@pytest.mark.parametrize("land_on_host", [False, True], ids=["in-process", "relay-landing"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_stage_keeps_its_tensors_on_its_device(checkpoints, shape, land_on_host):
    model = checkpoints[shape]
    _, turns = SHAPES[shape]
    starts = turns(model) if shape.startswith("qwen3-tts") else turns()
    events, workers, acc = _run_audited(model, starts, land_on_host)
    assert acc.violations == []
    for evs in events:
        kinds = [e.kind for e in evs]
        assert kinds[-1] == "done", [e.error for e in evs if e.kind == "error"]
        assert any(e.kind == "audio" and e.pcm.size for e in evs)
    engines = [w.engine for w in workers.values() if hasattr(w, "engine")]
    assert engines and all(acc.on_device(e.kv[0][0]) for e in engines)  # the KV cache lives on the device


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_cascade_llm_stage_keeps_its_tensors_on_its_device(tmp_path):
    d = write_checkpoint(tmp_path / "text", "tiny", seed=1, text_only=True)
    (d / "chat_template.jinja").write_text(CHATML)
    acc = FakeAccelerator()
    sampling = {"max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "repetition_penalty": 1.1,
                "ignore_eos": True}
    with acc:
        model = load_model(d, parts=("thinker",), device="privateuseone")
        w = LLMWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256))
        context = Prefill(system_prompt="Be brief.", history=[])
        hint = PartialTranscript(partial_transcript="hello", prefill=context)
        w.submit(StageMessage("t1", {}, hint, last=False))
        opts = TurnOptions(system_prompt="Be brief.", sampling=sampling)
        w.submit(StageMessage("t1", {}, Transcript(transcript="hello there", turn=opts), last=True))
        outs = []
        for _ in range(100):
            if not w.has_work():
                break
            outs += w.step()
    assert acc.violations == [] and acc.on_device(w.engine.kv[0][0])
    assert outs[-1].last and len(outs) == 5
