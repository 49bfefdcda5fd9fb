"""The cascade with Qwen3-TTS as its TTS stage (``init-cascade --tts QWEN3_TTS_DIR``), tiny preset: the
manifest names the checkpoint and voice, the stage streams each clause's speech (1-frame first piece) at
the graph's 24 kHz with the reply's text aligned to it, abort stops a turn, and a spoken question gets a
spoken reply through the whole in-process pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from test_tts_stage import norm, tokens
from typer.testing import CliRunner

from omniduplex.app.host.pipeline import RespondOptions
from omniduplex.cli.main import cli
from omniduplex.cli.respond import respond
from omniduplex.models.cascade.manifest import load_manifest, write_manifest
from omniduplex.models.qwen3_tts.generate import generate_codes
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
from omniduplex.pipeline.config import ChunkingConfig, StageConfig
from omniduplex.pipeline.messages import AudioOutput, DecoderOutput, StageMessage, TurnOptions
from omniduplex.pipeline.stages.qwen3_tts_stage import Qwen3TTSStageWorker
from omniduplex.pipeline.topology import CASCADE_OUTPUT_RATE, output_rate
from omniduplex.pipeline.workers import build_worker

REPLY = "Sure! The museum opens at nine on Sundays, and it closes at six."
MAX_FRAMES = 8
QUESTION = Path(__file__).resolve().parents[1] / "examples" / "green_tea.wav"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("q3tts_cascade")
    tts = write_tts_checkpoint(root / "cv", "tiny", 0, "custom_voice")
    res = CliRunner().invoke(
        cli, ["init-cascade", "--out", str(root / "m"), "--tts", str(tts), "--tts-voice", "Serena"]
    )
    assert res.exit_code == 0, res.output
    path = Path(json.loads(res.output.strip().splitlines()[-1])["manifest"])
    m = load_manifest(path)
    # a short per-clause budget: the random tiny talker rarely samples EOS
    write_manifest(
        path,
        m.asr,
        m.llm,
        m.tts,
        llm_quantized=m.llm_quantized,  # as init-cascade wrote it: the default LLM on its quantized blocks
        tts_voice={"tts_voice": m.tts_voice, "tts_max_frames": MAX_FRAMES},
    )
    return path


def feed_and_drain(
    w: Qwen3TTSStageWorker, rid: str, text: str, turn: TurnOptions | None = None
) -> list[StageMessage]:
    """``text`` as the LLM stage sends it, one token at a time (``turn``: the options on its first message),
    stepping like the stage loop; the stage's messages."""
    outs = []
    for i, tok in enumerate(tokens(text)):
        meta = DecoderOutput(text=tok, turn=(turn or TurnOptions()) if i == 0 else None)
        w.submit(StageMessage(rid, {}, meta))
        outs += w.step()
    w.submit(StageMessage(rid, {}, DecoderOutput(text=""), last=True))
    while w.has_work():
        outs += w.step()
    return outs


def test_init_cascade_writes_a_qwen3_tts_manifest(manifest, tmp_path):
    m = load_manifest(manifest)
    assert m.tts_is_qwen3 and m.tts_config is None and m.tts_voice == "Serena"
    assert m.tts_max_frames == MAX_FRAMES and output_rate(manifest) == 24000
    bad = CliRunner().invoke(
        cli, ["init-cascade", "--out", str(tmp_path / "x"), "--tts", str(m.tts), "--tts-voice", "alloy"]
    )
    assert bad.exit_code != 0 and "serena" in bad.output
    piper_voice = CliRunner().invoke(cli, ["init-cascade", "--out", str(tmp_path / "y"), "--tts-voice", "x"])
    assert piper_voice.exit_code != 0 and "Qwen3-TTS --tts" in piper_voice.output


@torch.no_grad()
def decode(w: Qwen3TTSStageWorker, codes: torch.Tensor) -> torch.Tensor:
    """One-shot decode of frames int ``[F, 16]`` → fp32 ``[F·1920]``."""
    return w.tts.model.codec(codes.T[None]).reshape(-1)


def test_stage_streams_each_clause_in_the_manifest_voice(manifest):
    w = build_worker("tts", manifest, StageConfig(num_kv_blocks=256), ChunkingConfig())
    assert isinstance(w, Qwen3TTSStageWorker) and w.voice.speaker == "Serena"
    w.sampling = {"temperature": 0.0}  # greedy: the audio is checked against the reference frames
    *chunks, final = feed_and_drain(w, "7", REPLY)
    assert final.last and final.meta.text == "" and final.tensors["pcm"].numel() == 0
    assert [m.meta.chunk for m in chunks] == list(range(len(chunks)))
    assert all(isinstance(m.meta, AudioOutput) and m.meta.skipped is None for m in chunks + [final])
    texts = [m.meta.text for m in chunks if m.meta.text]
    assert len(texts) >= 2 and norm("".join(texts)) == norm(REPLY)
    # each clause: its text on its first piece (one frame: 1920 samples at 24 kHz), then its other pieces;
    # together the one-shot decode of the greedy reference frames of that clause in Serena's voice
    starts = [i for i, m in enumerate(chunks) if m.meta.text] + [len(chunks)]
    for a, b in zip(starts, starts[1:]):
        pcm = torch.cat([m.tensors["pcm"] for m in chunks[a:b]])
        assert chunks[a].tensors["pcm"].shape == (1920,) and pcm.dtype == torch.float32
        prompt = w.prompter.prompt(chunks[a].meta.text, w.voice)
        codes = generate_codes(w.tts.model.talker, prompt, max_new_tokens=MAX_FRAMES)
        torch.testing.assert_close(pcm, decode(w, codes), rtol=0, atol=1e-5)


def test_abort_mid_turn_stops_it(manifest):
    w = build_worker("tts", manifest, StageConfig(num_kv_blocks=256), ChunkingConfig())
    for tok in tokens(REPLY):
        w.submit(StageMessage("1", {}, DecoderOutput(text=tok)))
    outs = w.step() + w.step()
    assert outs and w.tts.has_unfinished()
    w.abort("1")
    w.submit(StageMessage("1", {}, DecoderOutput(text=" more"), last=True))
    assert not w.has_work() and not w.tts.has_unfinished() and w.step() == []


@pytest.mark.slow
def test_a_spoken_question_gets_a_qwen3_tts_reply(manifest, tmp_path):
    out = tmp_path / "reply.wav"
    code = respond(QUESTION, out, manifest, None, RespondOptions(greedy=True, max_tokens=10), processes=False)
    assert code == 0
    wav, rate = sf.read(str(out), dtype="float32")
    assert rate == CASCADE_OUTPUT_RATE == 24000
    assert wav.shape[0] >= 1920 and wav.shape[0] % 1920 == 0  # whole codec frames only
    assert np.abs(wav).max() > 0.01


def test_turn_voice_picks_the_speaker(manifest):
    """A turn's ``voice`` (the Realtime session's) speaks in that CustomVoice speaker; an unknown name keeps
    the manifest's (Serena)."""
    w = build_worker("tts", manifest, StageConfig(num_kv_blocks=256), ChunkingConfig())
    w.sampling = {"temperature": 0.0}

    def speak(rid: str, voice: str) -> tuple[torch.Tensor, list[str]]:
        outs = feed_and_drain(w, rid, REPLY, TurnOptions(voice=voice))
        return torch.cat([m.tensors["pcm"] for m in outs]), [m.meta.text for m in outs if m.meta.text]

    def oracle(speaker: str, clauses: list[str]) -> torch.Tensor:
        out = []
        for clause in clauses:
            prompt = w.prompter.prompt(clause, w.prompter.voice(speaker))
            codes = generate_codes(w.tts.model.talker, prompt, max_new_tokens=MAX_FRAMES)
            out.append(decode(w, codes))
        return torch.cat(out)

    (aiden, clauses), (alloy, same) = speak("1", "Aiden"), speak("2", "alloy")
    assert clauses == same and len(clauses) >= 2
    torch.testing.assert_close(aiden, oracle("aiden", clauses), rtol=0, atol=1e-5)
    torch.testing.assert_close(alloy, oracle("serena", clauses), rtol=0, atol=1e-5)
    assert not torch.equal(aiden, alloy)


def test_speech_endpoint_uses_the_cascade_tts(manifest):
    from omniduplex.app.host.speech.services import tts_dirs
    from omniduplex.app.server import ServerConfig

    assert tts_dirs(ServerConfig(model=str(manifest))) == [str(load_manifest(manifest).tts)]
    assert tts_dirs(ServerConfig(model=str(manifest), tts="/x")) == ["/x"]
    assert tts_dirs(ServerConfig()) == []
