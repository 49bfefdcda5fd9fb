"""The unified graph (codec encoder → unified LM → DAC codec) in-process: a spoken turn equals the
sequential reference on the same prompt, the streamed waveform equals the one-shot decode, text-only
turns work, cancellation frees the engine, bad input fails only its own turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from turns import run_turn

from omniduplex.models.registry import load_model
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.models.unified.presets import write_unified_checkpoint
from omniduplex.models.unified.prompt import conversation_steps, speech_steps
from omniduplex.models.unified.reference import generate
from omniduplex.pipeline.audio_io import MODEL_INPUT_RATE, load_audio
from omniduplex.pipeline.config import ChunkingConfig, PipelineConfig
from omniduplex.pipeline.messages import TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.topology import UNIFIED, output_rate, topology_for
from omniduplex.pipeline.workers import build_all

QUESTION = Path(__file__).parents[1] / "examples" / "question.wav"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_unified_checkpoint(tmp_path_factory.mktemp("unified"), "tiny", seed=3)


def _orchestrator(ckpt, chunking: ChunkingConfig | None = None):
    pcfg = PipelineConfig(model=str(ckpt), chunking=chunking or ChunkingConfig())
    backend = LocalBackend(build_all(pcfg))
    return Orchestrator(backend, load_tokenizer(ckpt), record=True, output_rate=output_rate(ckpt)), backend


def _meta(**kw):
    fields = {"max_text_tokens": 3, "max_audio_frames": 10, "cfg_scale": 2.0, "sampling": {"temperature": 0}}
    return TurnOptions(**fields | kw)


def test_topology_of_a_unified_checkpoint(ckpt):
    assert topology_for(ckpt) is UNIFIED
    assert output_rate(ckpt) == 44100


@pytest.mark.parametrize(
    "chunking", [ChunkingConfig(), ChunkingConfig(initial_codec_chunk_frames=1, codec_chunk_frames=3)]
)
def test_spoken_turn_equals_reference_and_one_shot_decode(ckpt, chunking):
    wav = load_audio(QUESTION)
    model = load_model(ckpt, parts=("unified", "codec", "codec_encoder"))
    tok = load_tokenizer(ckpt)
    cfg = model.unified_config

    async def main():
        orch, _ = _orchestrator(ckpt, chunking)
        await orch.start()
        try:
            return await run_turn(orch, wav, _meta())
        finally:
            await orch.stop()

    events, record = asyncio.run(main())
    assert events[-1].kind == "done", events[-1]
    # the same prompt through the sequential reference (with CFG): identical text and codes
    import soxr

    x = torch.from_numpy(soxr.resample(wav, MODEL_INPUT_RATE, 44100, quality="HQ").astype(np.float32))
    codes_in = model.codec_encoder.encode(x[None, None], cfg.num_streams)[0]
    assert codes_in.shape[1] == model.codec_encoder.num_frames(x.numel())
    prompt = conversation_steps(cfg, tok, codes_in)
    assert (prompt[:, 1:] >= 0).any()  # speech steps are in the prompt
    ref = generate(model.unified, prompt, 3, 10, cfg_scale=2.0)
    assert record["text_token_ids"] == ref.text_ids
    assert record["codes"] == ref.codes.T.tolist() and len(record["codes"]) == 10
    # the streamed PCM tiles the one-shot decode of those codes
    pcm = np.concatenate([e.pcm for e in events if e.kind == "audio"])
    one_shot = model.codec.decode(ref.codes[None])[0, 0].numpy()
    assert pcm.shape == one_shot.shape
    np.testing.assert_allclose(pcm, one_shot, atol=1e-4, rtol=0)
    m = events[-1].metrics
    assert m["audio_s"] == pytest.approx(pcm.size / 44100)


def test_text_only_turn_and_bad_input_fail_alone(ckpt):
    async def main():
        orch, _ = _orchestrator(ckpt)
        await orch.start()
        try:
            bad = await run_turn(orch, np.zeros(0, np.float32), _meta())
            text = await run_turn(orch, np.zeros(0, np.float32), _meta(user_text="Say hi."))
            return bad, text
        finally:
            await orch.stop()

    (bad, _), (text, record) = asyncio.run(main())
    assert bad[-1].kind == "error" and "empty waveform" in bad[-1].error
    assert text[-1].kind == "done" and len(record["codes"]) == 10


def test_cancel_mid_audio_frees_the_engine(ckpt):
    async def main():
        orch, backend = _orchestrator(ckpt)
        await orch.start()
        engine = backend.workers["unified"].engine
        try:
            rid = orch.submit(load_audio(QUESTION), _meta(max_audio_frames=400))
            async for ev in orch.events(rid):
                if ev.kind == "audio":
                    orch.cancel(rid)
            for _ in range(100):
                await asyncio.sleep(0.02)
                if not engine.has_unfinished() and not backend.workers["codec"].streams:
                    break
            return ev, engine
        finally:
            await orch.stop()

    last, engine = asyncio.run(main())
    assert last.kind == "error" and last.error == "cancelled"
    assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_blocks


def test_speech_steps_follow_the_delay_pattern(ckpt):
    cfg = load_model(ckpt, parts=("unified",)).unified_config
    codes = torch.arange(cfg.num_streams * 3).view(cfg.num_streams, 3) % cfg.codebook_size
    steps = speech_steps(cfg, codes)
    assert steps.shape == (3 + cfg.num_streams - 1, cfg.num_streams)
    for i in range(cfg.num_streams):
        col = steps[:, i] - cfg.stream_offset(i)
        assert col[i : i + 3].tolist() == codes[i].tolist()
        assert (steps[:i, i] == cfg.audio_pad_id(i)).all() and (
            steps[i + 3 :, i] == cfg.audio_pad_id(i)
        ).all()
    with pytest.raises(ValueError):
        speech_steps(cfg, codes[:1])
    with pytest.raises(ValueError):
        speech_steps(cfg, codes + cfg.codebook_size)
