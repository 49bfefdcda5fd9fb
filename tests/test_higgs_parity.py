"""Higgs Audio v3 on our engine against ``transformers`` 5.19 (built and run here, :mod:`higgs_reference`):
greedy code frames identical in fp32, batched, on the tiny and the deeper preset, under both rule sets, with
zero-shot and cloning prompts, clips ended by EOC and by length; the streamed waveform within 1 LSB (int16)
of the reference tokenizer's decode."""

from __future__ import annotations

import pytest
import torch
from higgs_reference import generate_transformers, generate_v3, reference_codec, reference_talker

from omniduplex.models.higgs.codec_stream import StreamingDecoder
from omniduplex.models.higgs.model import load_higgs
from omniduplex.models.higgs.presets import write_higgs_checkpoint
from omniduplex.pipeline.speech.higgs import HiggsEngine
from omniduplex.pipeline.stages.engine_build import EngineSettings

MAX_STEPS = 40
# (preset, seed): prompts (text, voice) per rule set; the seeds were picked so that each rule set has clips
# that end by EOC and clips cut by length (the test asserts both happen)
CASES = {
    ("tiny", 0): {
        "v3": [("One two three four five.", None), ("Hello there, how are you?", "belinda")],
        "transformers": [("Hello there, how are you?", "belinda"), ("Short.", None)],
    },
    ("deep", 3): {
        "v3": [("One two three four five.", None), ("Hello there, how are you?", "belinda")],
        "transformers": [("Short.", "belinda"), ("Hello there, how are you?", None)],
    },
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: two collapse on a shared 2-core host; results do not change."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _int16(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(x * 32768), -32768, 32767)


def _run(engine: HiggsEngine, prompts, max_tokens: int = MAX_STEPS):
    for i, p in enumerate(prompts):
        engine.add(f"r{i}", p, {"temperature": 0.0, "max_tokens": max_tokens})
    frames, reasons = {}, {}
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.codes is not None:
                frames.setdefault(ev.request_id, []).append(ev.codes)
            if ev.finished:
                reasons[ev.request_id] = ev.finish_reason
    n = engine.cfg.num_codebooks
    out = [
        torch.stack(frames[f"r{i}"]) if f"r{i}" in frames else torch.zeros(0, n) for i in range(len(prompts))
    ]
    return out, [reasons[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module", params=sorted(CASES), ids=lambda k: f"{k[0]}-seed{k[1]}")
def setup(request, tmp_path_factory):
    preset, seed = request.param
    path = write_higgs_checkpoint(tmp_path_factory.mktemp(f"higgs_{preset}") / "ckpt", preset, seed)
    ref, spare = reference_talker(path)
    return request.param, load_higgs(path), ref, spare, reference_codec(path)


@pytest.mark.parametrize("rules", ["v3", "transformers"])
def test_greedy_frames_match_transformers(setup, rules):
    key, model, ref, spare, codec = setup
    engine = HiggsEngine(model, rules=rules, engine=EngineSettings(num_blocks=128))
    prompts = [engine.prompt(t, v) for t, v in CASES[key][rules]]
    ours, reasons = _run(engine, prompts)
    assert set(reasons) == {"stop", "length"}, reasons  # both ends are exercised
    for i, p in enumerate(prompts):
        if rules == "transformers":
            want, steps, wave = generate_transformers(ref, spare, p, MAX_STEPS, codec)
        else:
            want, steps = generate_v3(ref, spare, p, MAX_STEPS)
            wave = codec.decode(want.T[None]).audio_values.reshape(-1)
        assert (steps < MAX_STEPS) == (reasons[i] == "stop")
        assert torch.equal(ours[i], want), f"case {i}: frames differ"
        # the streamed waveform (uneven pieces, each frame decoded once) vs the reference tokenizer's decode
        stream = StreamingDecoder(model.codec)
        cuts = [0, 1, 4, 11, ours[i].shape[0]]
        pieces = [stream.feed(ours[i][a:b]) for a, b in zip(cuts, cuts[1:])] + [stream.flush()]
        pcm = torch.cat(pieces)
        assert pcm.shape == wave.shape == (ours[i].shape[0] * model.codec.hop_length,)
        assert float(wave.abs().max()) > 0.05  # not silent
        assert float((_int16(pcm) - _int16(wave)).abs().max()) <= 1


def test_tied_head_preset_matches_transformers(tmp_path):
    """The ``small`` preset ties the audio head to the fused embedding, as the published checkpoint does."""
    path = write_higgs_checkpoint(tmp_path / "small", "small", 0)
    model = load_higgs(path, parts=("talker",))
    assert model.talker.tied.head.modality_heads[0].weight is model.talker.audio_embedding.embedding.weight
    ref, spare = reference_talker(path)
    for rules in ("v3", "transformers"):
        engine = HiggsEngine(model, rules=rules, engine=EngineSettings(num_blocks=64))
        prompt = engine.prompt("Tied weights.", "en_man")
        (ours,), _ = _run(engine, [prompt], max_tokens=20)
        gen = generate_transformers if rules == "transformers" else generate_v3
        assert torch.equal(ours, gen(ref, spare, prompt, 20)[0])
