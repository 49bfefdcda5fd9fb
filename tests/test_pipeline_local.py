"""The four stage workers chained in-process: streamed output equals the sequential reference,
cancellation frees every stage, bad input fails only its own turn."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from turns import run_turn

from omniduplex.models.mel import LogMelFrontEnd
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.qwen3_omni.reference import generate_turn
from omniduplex.models.registry import load_model
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import ChunkingConfig, PipelineConfig
from omniduplex.pipeline.messages import DecoderOutput, StageMessage, TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.stages.vocoder import VocoderWorker
from omniduplex.pipeline.workers import build_all

QUESTION = Path(__file__).parents[1] / "examples" / "question.wav"
GREEDY = TurnOptions(
    sampling={"temperature": 0.0, "max_tokens": 10},
    talker_sampling={"temperature": 0.0, "max_tokens": 24},
)


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
        ChunkingConfig(initial_codec_chunk_frames=1, codec_chunk_frames=3),
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
    # the TTFP split: Talker admission → first frame, then that frame at Code2Wav → first audio (whose
    # forward is codec_first_chunk_ms): successive spans inside submit → first audio
    assert done["talker_first_frame_ms"] > 0 and 0 < done["codec_first_chunk_ms"] <= done["codec_wait_ms"]
    assert done["talker_first_frame_ms"] + done["codec_wait_ms"] <= done["ttfp_ms"]


def test_cancel_frees_every_stage_and_other_turns_continue(ckpt):
    wav = load_audio(QUESTION)
    long = TurnOptions(  # a reply no sampled codec EOS ends before it is cancelled
        sampling={"temperature": 0.0, "max_tokens": 40},
        talker_sampling={"max_tokens": 400, "ignore_eos": True},
    )

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
            w = orch.backend.workers
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(  # the backend thread applies the abort
                w[s].engine.has_unfinished() for s in ("thinker", "talker")
            ):
                await asyncio.sleep(0.02)
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


class _LookaheadStream:
    """A vocoder stream with 3 frames of look-ahead: 10 samples per frame, out once 3 later frames exist."""

    def __init__(self) -> None:
        self.frames, self.pushes = 0, []

    def push(self, codes: torch.Tensor) -> torch.Tensor:
        before, self.frames = self.frames, self.frames + codes.shape[-1]
        self.pushes.append(codes.shape[-1])
        return torch.zeros(1, 1, 10 * (max(0, self.frames - 3) - max(0, before - 3)))

    def flush(self) -> torch.Tensor:
        self.pushes.append("flush")
        return torch.zeros(1, 1, 10 * min(3, self.frames))


def test_vocoder_pushes_small_groups_until_audio_then_steady_chunks():
    streams = []

    def new_stream() -> _LookaheadStream:
        streams.append(_LookaheadStream())
        return streams[-1]

    w = VocoderWorker(new_stream, ChunkingConfig(initial_codec_chunk_frames=2, codec_chunk_frames=5))
    out = []
    for i in range(14):
        w.submit(StageMessage("t", {"codes": torch.tensor([i, i])}, DecoderOutput(), last=i == 13))
        while w.has_work():
            out += [(len(m.tensors["pcm"]), m.last) for m in w.step()]
    # groups of 2 while nothing came out (look-ahead), then 5, then the rest with the flush
    assert streams[0].pushes == [2, 2, 5, 5, "flush"]
    assert out == [(10, False), (50, False), (80, True)]  # 14 frames → 140 samples, every one once
    assert w.streams == {}
    with pytest.raises(ValueError, match=r"\[G\]"):
        w.submit(StageMessage("u", {"codes": torch.zeros(2, 2, dtype=torch.int64)}, DecoderOutput()))


def test_vocoder_serves_first_packets_before_steady_chunks():
    w = VocoderWorker(_LookaheadStream, ChunkingConfig(initial_codec_chunk_frames=1, codec_chunk_frames=1))
    for i in range(5):  # turn "a" is past its look-ahead and speaking
        w.submit(StageMessage("a", {"codes": torch.tensor([i])}, DecoderOutput()))
        w.step()
    w.submit(StageMessage("a", {"codes": torch.tensor([5])}, DecoderOutput()))
    w.submit(StageMessage("b", {"codes": torch.tensor([0])}, DecoderOutput()))  # a new turn
    assert [m.request_id for m in w.step()] == []  # only "b" was pushed (still in its look-ahead)
    assert w.streams["a"].pending and not w.streams["b"].pending
    assert [m.request_id for m in w.step()] == ["a"]  # "b" waits for frames, "a" goes on
