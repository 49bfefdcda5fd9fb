"""VoxCPM2, Higgs Audio v3 and Fish Speech S2 Pro as the cascade's TTS stage (``init-cascade --tts DIR``,
tiny presets): the manifest records the checkpoint (family read from its config), the ``tts`` stage worker
runs the family's engine, and a streamed reply comes out as 24 kHz audio clause by clause, each clause's
audio the family's one-shot ``synthesize`` of that clause resampled to the graph's rate, with the reply's
text aligned to it; a bad manifest voice fails the stage's start with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from test_tts_stage import norm, tokens
from typer.testing import CliRunner

from omniduplex.app.host.pipeline import RespondOptions
from omniduplex.cli.main import cli
from omniduplex.cli.respond import respond
from omniduplex.models.cascade.manifest import load_manifest, write_manifest
from omniduplex.models.fish_speech.presets import write_fish_checkpoint
from omniduplex.models.higgs.presets import write_higgs_checkpoint
from omniduplex.models.voxcpm2.presets import write_voxcpm2_checkpoint
from omniduplex.pipeline.config import ChunkingConfig, StageConfig
from omniduplex.pipeline.messages import DecoderOutput, StageMessage, TurnOptions
from omniduplex.pipeline.speech import fish_speech, higgs, voxcpm2
from omniduplex.pipeline.speech.family_runner import TTSInputError
from omniduplex.pipeline.stages.runner_tts import RunnerTTSStageWorker
from omniduplex.pipeline.topology import output_rate
from omniduplex.pipeline.workers import build_worker

QUESTION = Path(__file__).resolve().parents[1] / "examples" / "green_tea.wav"
REPLY = "Sure! The museum opens at nine, and it closes at six."
FRAMES = 4
WRITERS = {
    "voxcpm2": write_voxcpm2_checkpoint,
    "higgs": write_higgs_checkpoint,
    "fish": write_fish_checkpoint,
}
GREEDY = {"voxcpm2": {"seed": 3}, "higgs": {"temperature": 0.0}, "fish": {"temperature": 0.0}}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def manifest(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"cascade_{request.param}")
    tts = WRITERS[request.param](root / "ckpt", "tiny", 0)
    res = CliRunner().invoke(cli, ["init-cascade", "--out", str(root / "m"), "--tts", str(tts)])
    assert res.exit_code == 0, res.output
    path = Path(json.loads(res.output.strip().splitlines()[-1])["manifest"])
    m = load_manifest(path)
    # short clauses; the LLM as init-cascade wrote it (the default's quantized blocks, not its fp32 import)
    short = {"tts_max_frames": FRAMES}
    write_manifest(path, m.asr, m.llm, m.tts, llm_quantized=m.llm_quantized, tts_voice=short)
    return request.param, path


def one_shot(w: RunnerTTSStageWorker, family: str, text: str) -> torch.Tensor:
    """The family's ``synthesize`` of ``text`` alone, resampled to 24 kHz."""
    r, sp = w.runner, GREEDY[family]
    if family == "voxcpm2":
        pcm, rate = voxcpm2.synthesize(r.model, r.tok, text, None, {**sp, "max_len": FRAMES})
    elif family == "higgs":
        n = r.model.config.num_codebooks
        pcm, rate = higgs.synthesize(r.model, text, None, {**sp, "max_tokens": FRAMES + n - 1})
    else:
        pcm, rate = fish_speech.synthesize(
            r.model, r.engine.tokenizer, text, None, {**sp, "max_tokens": FRAMES}
        )
    pcm = torch.as_tensor(np.asarray(pcm)).reshape(-1).float().numpy()
    return torch.from_numpy(soxr.resample(pcm, rate, 24000) if rate != 24000 else pcm)


def test_stage_speaks_each_clause_with_the_family_engine(manifest):
    family, path = manifest
    m = load_manifest(path)
    assert m.tts_is_checkpoint and m.llm_quantized and output_rate(path) == 24000
    w = build_worker("tts", path, StageConfig(num_kv_blocks=64), ChunkingConfig())
    assert isinstance(w, RunnerTTSStageWorker) and w.output_rate == 24000
    w.sampling = GREEDY[family]
    outs = []
    for i, tok in enumerate(tokens(REPLY)):
        w.submit(StageMessage("7", {}, DecoderOutput(text=tok, turn=TurnOptions() if i == 0 else None)))
        outs += w.step()
    w.submit(StageMessage("7", {}, DecoderOutput(text=""), last=True))
    while w.has_work():
        outs += w.step()
    *chunks, final = outs
    assert final.last and final.meta.text == "" and final.tensors["pcm"].numel() == 0
    assert [m.meta.chunk for m in chunks] == list(range(len(chunks)))
    texts = [m.meta.text for m in chunks if m.meta.text]
    assert len(texts) >= 2 and norm("".join(texts)) == norm(REPLY)
    starts = [i for i, m in enumerate(chunks) if m.meta.text] + [len(chunks)]
    for a, b in zip(starts, starts[1:]):
        pcm = torch.cat([m.tensors["pcm"] for m in chunks[a:b]])
        want = one_shot(w, family, chunks[a].meta.text)
        assert pcm.numel() > 0 and pcm.dtype == torch.float32
        torch.testing.assert_close(pcm, want, rtol=0, atol=1e-4)


def test_a_voice_the_family_lacks_fails_the_stage_start(manifest):
    family, path = manifest
    m = load_manifest(path)
    bad = path.with_name("bad.yaml")
    write_manifest(bad, m.asr, m.llm, m.tts, llm_quantized=m.llm_quantized, tts_voice={"tts_voice": "alloy"})
    with pytest.raises(TTSInputError, match="alloy"):
        build_worker("tts", bad, StageConfig(num_kv_blocks=64), ChunkingConfig())


@pytest.mark.slow
def test_a_spoken_question_gets_a_reply_in_the_family_voice(manifest, tmp_path):
    """A whole cascade turn (ASR → LLM → this family's TTS stage, in process) answers in audio."""
    _, path = manifest
    out = tmp_path / "reply.wav"
    code = respond(QUESTION, out, path, None, RespondOptions(greedy=True, max_tokens=10), processes=False)
    assert code == 0
    wav, rate = sf.read(str(out), dtype="float32")
    assert rate == 24000 and wav.shape[0] > 0 and np.abs(wav).max() > 0
