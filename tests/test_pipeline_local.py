"""The four stage workers chained in-process: streamed output equals the sequential reference,
cancellation frees every stage, bad input fails only its own turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from turns import run_turn

from omniduplex.models.mel import LogMelFrontEnd
from omniduplex.models.presets import write_checkpoint
from omniduplex.models.reference import generate_turn
from omniduplex.models.registry import load_model
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.connector import ChunkingConfig, decode_windows, frames_to_decode
from omniduplex.pipeline.graph import build_all
from omniduplex.pipeline.local_backend import LocalBackend
from omniduplex.pipeline.orchestrator import Orchestrator

QUESTION = Path(__file__).parents[1] / "examples" / "question.wav"
GREEDY = {
    "sampling": {"temperature": 0.0, "max_tokens": 10},
    "talker_sampling": {"temperature": 0.0, "max_tokens": 24},
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=4)


def _orchestrator(ckpt, chunking: ChunkingConfig | None = None) -> Orchestrator:
    pcfg = PipelineConfig(model=str(ckpt), chunking=chunking or ChunkingConfig())
    return Orchestrator(LocalBackend(build_all(pcfg)), load_tokenizer(ckpt), record=True)




@pytest.mark.parametrize(
    "chunking",
    [
        ChunkingConfig(),
        ChunkingConfig(initial_codec_chunk_frames=1, codec_chunk_frames=3, decode_chunk_frames=2),
    ],
)
def test_streamed_turn_equals_sequential_reference(ckpt, chunking):
    wav = load_audio(QUESTION)

    async def main():
        orch = _orchestrator(ckpt, chunking)
        await orch.start()
        try:
            return await run_turn(orch, wav, GREEDY)
        finally:
            await orch.stop()

    events, record = asyncio.run(main())
    assert [e.kind for e in events][-1] == "done"
    model = load_model(ckpt)
    feats, _ = LogMelFrontEnd()([torch.from_numpy(wav)])
    ref = generate_turn(
        model, record["prompt_token_ids"], feats[0], max_new_tokens=10, talker_max_new_tokens=24
    )
    assert record["text_token_ids"] == ref.thinker_token_ids
    assert record["codes"] == ref.talker_codes and len(ref.talker_codes) > 0
    streamed = np.concatenate([e.pcm for e in events if e.kind == "audio"])
    one_shot = model.code2wav(torch.tensor(ref.talker_codes).T[None])[0, 0].numpy()
    assert streamed.shape == one_shot.shape
    assert np.abs(streamed - one_shot).max() <= 1e-4 * max(1.0, np.abs(one_shot).max())
    text = "".join(e.text for e in events if e.kind == "text")
    assert text == load_tokenizer(ckpt).decode(ref.thinker_token_ids, skip_special_tokens=True)
    done = events[-1].metrics
    assert done["audio_s"] == pytest.approx(streamed.size / 24000)
    assert 0 < done["ttfp_ms"] <= done["e2el_ms"]


def test_cancel_frees_every_stage_and_other_turns_continue(ckpt):
    wav = load_audio(QUESTION)
    long = {  # a reply no sampled codec EOS ends before it is cancelled
        "sampling": {"temperature": 0.0, "max_tokens": 40},
        "talker_sampling": {"max_tokens": 400, "ignore_eos": True},
    }

    async def main():
        orch = _orchestrator(ckpt)
        await orch.start()
        try:
            victim = orch.submit(wav, long)
            other = asyncio.create_task(run_turn(orch, wav, GREEDY))
            kinds = []
            async for ev in orch.events(victim):
                kinds.append(ev.kind)
                if ev.kind == "audio":
                    orch.cancel(victim)
            events, _ = await other
            await asyncio.sleep(0.2)  # let the backend thread apply the abort
            w = orch.backend.workers
            return kinds, events, w
        finally:
            await orch.stop()

    kinds, events, w = asyncio.run(main())
    assert kinds[-1] == "error" and "audio" in kinds
    assert events[-1].kind == "done"
    for stage in ("thinker", "talker"):
        eng = w[stage].engine
        assert not eng.has_unfinished()
        assert eng.scheduler.allocator.num_free == eng.scheduler.allocator.num_blocks
    assert w["code2wav"].streams == {}


def test_bad_audio_fails_its_turn_only(ckpt):
    wav = load_audio(QUESTION)

    async def main():
        orch = _orchestrator(ckpt)
        await orch.start()
        try:
            bad = asyncio.create_task(run_turn(orch, np.zeros(10, np.float32), GREEDY))
            good = asyncio.create_task(run_turn(orch, wav, GREEDY))
            return await bad, await good
        finally:
            await orch.stop()

    (bad, _), (good, _) = asyncio.run(main())
    assert bad[-1].kind == "error" and "waveform" in bad[-1].error
    assert good[-1].kind == "done"


def test_chunking_policy():
    cfg = ChunkingConfig(initial_codec_chunk_frames=2, codec_chunk_frames=5, decode_chunk_frames=3)
    assert frames_to_decode(1, 0, False, cfg) == 0
    assert frames_to_decode(2, 0, False, cfg) == 2
    assert frames_to_decode(6, 2, False, cfg) == 0
    assert frames_to_decode(7, 2, False, cfg) == 5
    assert frames_to_decode(3, 2, True, cfg) == 1
    assert frames_to_decode(2, 2, True, cfg) == 0
    assert decode_windows(2, 9, cfg) == [(2, 5), (5, 8), (8, 9)]
