"""Qwen3-TTS on our engine: greedy frames equal the reference's (goldens), batching changes nothing,
the streamed waveform equals the one-shot decode, and ``omniduplex speak`` writes the utterance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from omniduplex.cli.main import cli
from omniduplex.models.qwen3_tts.model import load_qwen3_tts
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
from omniduplex.models.qwen3_tts.prompt import build_prompt
from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine, stream_speech
from omniduplex.pipeline.stages.engine_build import EngineSettings

GOLDEN = Path(__file__).parent / "golden" / "qwen3_tts" / "tiny.npz"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("q3tts_engine")
    path = write_tts_checkpoint(root / "cv", "tiny", 0, "custom_voice")
    golden = dict(np.load(GOLDEN))
    cases = [c for c in json.loads(str(golden["cases"])) if c["variant"] == "custom_voice"]
    return path, load_qwen3_tts(path), golden, cases


def _prompt(model, case):
    return build_prompt(
        model.talker,
        case["ids"],
        language=case["language"],
        speaker=case["speaker"],
        instruct_ids=case["instruct"],
        non_streaming=case["non_streaming"],
    )


def _run(engine: Qwen3TTSEngine) -> dict[str, list[torch.Tensor]]:
    frames: dict[str, list[torch.Tensor]] = {}
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.codes is not None:
                frames.setdefault(ev.request_id, []).append(ev.codes)
    return frames


def test_engine_greedy_matches_reference_batched(setup):
    _, model, golden, cases = setup
    n = int(golden["max_new_tokens"])
    engine = Qwen3TTSEngine(model, EngineSettings(num_blocks=64, max_num_seqs=8))
    for i, case in enumerate(cases):  # all at once: continuous batching, prefill chunks mixed with decodes
        engine.add(f"r{i}", _prompt(model, case), {"temperature": 0.0, "max_tokens": n})
    frames = _run(engine)
    for i in range(len(cases)):
        got = torch.stack(frames[f"r{i}"])
        want = torch.from_numpy(golden[f"codes_{i}"].astype(np.int64))
        assert torch.equal(got, want), f"case {i}"


def test_stream_speech_equals_one_shot_decode(setup):
    _, model, _, cases = setup
    prompt = _prompt(model, cases[0])
    engine = Qwen3TTSEngine(model, EngineSettings(num_blocks=64, max_num_seqs=2))
    pieces = list(stream_speech(engine, prompt, {"temperature": 0.0, "max_tokens": 30}))
    assert pieces[0].shape[0] == 1920  # the first chunk is one frame
    engine.add("again", prompt, {"temperature": 0.0, "max_tokens": 30})
    codes = torch.stack(_run(engine)["again"]).T[None]
    assert codes.shape[-1] == 29
    with torch.no_grad():
        want = model.codec(codes).reshape(-1)
    torch.testing.assert_close(torch.cat(pieces), want, rtol=0, atol=1e-5)


def test_speak_cli_writes_wav(setup, tmp_path):
    path = setup[0]
    out = tmp_path / "s.wav"
    args = ["speak", "--model", str(path), "--text", "Hello!", "--voice", "aiden", "--max-frames", "12"]
    res = CliRunner().invoke(cli, [*args, "--output", str(out), "--greedy"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output.strip().splitlines()[-1])
    wav, rate = sf.read(str(out))
    assert rate == 24000 and wav.shape[0] == 11 * 1920 and info["audio_seconds"] == pytest.approx(11 * 0.08)
    assert np.abs(wav).max() > 0.01  # not silence
    bad = CliRunner().invoke(cli, ["speak", "--model", str(path), "--text", "Hi", "--ref-audio", str(out)])
    assert bad.exit_code != 0 and "needs a Base checkpoint" in bad.output


def test_speak_clones_a_voice_in_context(tmp_path):
    base = write_tts_checkpoint(tmp_path / "base", "tiny", 0, "base")
    ref = tmp_path / "ref.wav"
    t = np.arange(24000) / 24000
    sf.write(str(ref), 0.3 * np.sin(2 * np.pi * 220 * t), 24000)
    out = tmp_path / "clone.wav"
    args = [
        "speak",
        "--model",
        str(base),
        "--text",
        "Hi there",
        "--ref-audio",
        str(ref),
        "--ref-text",
        "Hello",
    ]
    res = CliRunner().invoke(cli, [*args, "--max-frames", "6", "--greedy", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert sf.read(str(out))[0].shape[0] == 5 * 1920
    no_audio = CliRunner().invoke(cli, ["speak", "--model", str(base), "--text", "Hi", "--ref-text", "Hello"])
    assert no_audio.exit_code != 0 and "--ref-text needs --ref-audio" in no_audio.output
