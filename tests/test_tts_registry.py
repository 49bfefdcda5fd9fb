"""TTS families by registration (``pipeline/speech/registry.py``): the four built-in families are found by
their ``config.json``; ``omniduplex speak`` says one utterance with a VoxCPM2, Higgs or Fish Speech
checkpoint (tiny presets) at the family's native rate, equal to the family's one-shot ``synthesize``, and
resamples with ``--rate``; a toy family registered from a test module (``--plugin tests/toy_family.py``)
is written by ``init-model``, spoken by ``speak``, measured by ``bench tts`` and served by ``omniduplex serve
--tts`` (a subprocess, no ``OMNIDUPLEX_*`` variables) sample for sample."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from typer.testing import CliRunner

from omniduplex.cli.main import cli
from omniduplex.pipeline.speech import fish_speech, higgs, voxcpm2
from omniduplex.pipeline.speech.registry import families, family_named, family_of

TOY = str(Path(__file__).with_name("toy_family.py"))
TEXT = "Hello there."
FRAMES = 6


def invoke(*args: str) -> dict:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def one_shot(family: str, d: Path) -> tuple[np.ndarray, int]:
    """The family's one-shot ``synthesize`` of :data:`TEXT` (greedy, seed 7, :data:`FRAMES` frames)."""
    r = family_named(family).runner(d)
    if family == "voxcpm2":
        pcm, rate = voxcpm2.synthesize(r.model, r.tok, TEXT, r.bank.get(None), {"seed": 7, "max_len": FRAMES})
    elif family == "higgs":
        n = r.model.config.num_codebooks
        pcm, rate = higgs.synthesize(r.model, TEXT, None, {"temperature": 0.0, "max_tokens": FRAMES + n - 1})
    else:
        pcm, rate = fish_speech.synthesize(
            r.model, r.engine.tokenizer, TEXT, None, {"temperature": 0.0, "max_tokens": FRAMES}
        )
    return np.asarray(torch.as_tensor(pcm).reshape(-1).float().numpy()), rate


def test_the_built_in_families_are_registered():
    names = {f.name for f in families()}
    assert {"qwen3-tts", "voxcpm2", "higgs", "fish-speech"} <= names
    rates = {f.name: f.sample_rate for f in families()}
    assert rates["voxcpm2"] == 48000 and rates["fish-speech"] == 44100 and rates["higgs"] == 24000
    with pytest.raises(KeyError, match="registered"):
        family_named("nope")


@pytest.mark.parametrize("family", ["voxcpm2", "higgs", "fish-speech"])
def test_speak_says_every_family_at_its_native_rate(family, tmp_path):
    d = tmp_path / "ckpt"
    invoke("init-model", "--arch", f"{family}-tiny", "--out", str(d))
    assert family_of(d).name == family
    out = tmp_path / "s.wav"
    args = ["speak", "--model", str(d), "--text", TEXT, "--max-frames", str(FRAMES), "--greedy"]
    args += ["--seed", "7"]
    info = invoke(*args, "--output", str(out))
    got, rate = sf.read(str(out), dtype="int16")
    want, native = one_shot(family, d)
    assert info["family"] == family and rate == native == family_named(family).sample_rate
    assert got.shape == want.shape and np.abs(want).max() > 0.01
    assert np.abs(got.astype(np.int32) - (np.clip(want, -1, 1) * 32767).astype(np.int32)).max() <= 2
    invoke(*args, "--output", str(tmp_path / "r.wav"), "--rate", "16000")
    low, low_rate = sf.read(str(tmp_path / "r.wav"), dtype="float32")
    assert low_rate == 16000 and abs(low.shape[0] - round(want.shape[0] * 16000 / native)) <= 1


def test_speak_refuses_what_is_no_family(tmp_path):
    res = CliRunner().invoke(cli, ["speak", "--model", str(tmp_path), "--text", "Hi"])
    assert res.exit_code != 0 and "registered TTS family" in res.output


def test_a_plugin_family_is_written_and_spoken(tmp_path):
    from toy_family import speech

    d = tmp_path / "toy"
    info = invoke("init-model", "--plugin", TOY, "--arch", "toy-tone-tiny", "--out", str(d))
    assert info["architecture"] == "toy-tone" and family_of(d).name == "toy-tone"
    out = tmp_path / "toy.wav"
    info = invoke("speak", "--plugin", TOY, "--model", str(d), "--text", "abc", "--output", str(out))
    got, rate = sf.read(str(out), dtype="float32")
    assert rate == 16000 and info["family"] == "toy-tone"
    np.testing.assert_allclose(got, speech("abc"), atol=1 / 32767)
    bad = CliRunner().invoke(cli, ["speak", "--plugin", "no_such_plugin", "--model", str(d), "--text", "a"])
    assert bad.exit_code != 0 and "no_such_plugin" in bad.output
    res = CliRunner().invoke(
        cli, ["bench", "tts", "--plugin", TOY, "--model", str(d), "--concurrency", "1,2"]
    )
    assert res.exit_code == 0, res.output
    rows = [line.split("|")[1:-1] for line in res.output.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    assert [r[0].strip() for r in rows] == ["1", "2"] and all(float(r[3]) > 0 for r in rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``omniduplex serve ARGS`` in a subprocess with a scrubbed environment (no ``OMNIDUPLEX_*``), its log in
    ``log``, up once ``path`` answers 200."""

    def __init__(self, args: list[str], log: Path, path: str = "/healthz", timeout_s: float = 300) -> None:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIDUPLEX_")}
        cmd = [sys.executable, "-m", "omniduplex.cli.main", "serve", "--port", str(port), *args]
        self.log = log
        with log.open("w") as f:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.base}{path}", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"serve did not answer {path}: " + log.read_text()[-3000:])
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the whole process group (the server and any stage process left)."""
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGTERM while the pipeline loads
            self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.mark.slow
def test_serve_speaks_with_a_plugin_family(tmp_path):
    """``omniduplex serve --plugin tests/toy_family.py --tts DIR``: ``POST /v1/audio/speech`` answers the toy
    family's tones resampled to 24 kHz, and ``GET /v1/audio/voices`` lists the family."""
    from toy_family import speech, write_toy

    d = tmp_path / "toy"
    write_toy(d, "tiny", 0, None)
    served = Served(["--model", "tiny", "--in-process", "--plugin", TOY, "--tts", str(d)], tmp_path / "log")
    try:
        body = {"model": "omniduplex", "input": "hi!", "response_format": "pcm"}
        r = httpx.post(f"{served.base}/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text
        got = np.frombuffer(r.content, "<i2").astype(np.float32) / 32767
        want = soxr.resample(speech("hi!"), 16000, 24000)
        assert got.shape == want.shape and np.abs(got - want).max() < 2e-3
        voices = httpx.get(f"{served.base}/v1/audio/voices", timeout=30).json()
        assert "toy-tone" in json.dumps(voices)
        bad = httpx.post(f"{served.base}/v1/audio/speech", json={**body, "voice": "alloy"}, timeout=30)
        assert bad.status_code == 400 and "alloy" in bad.text
    finally:
        served.stop()


@pytest.mark.slow
def test_stage_processes_import_the_plugins(tmp_path):
    """A cascade whose TTS is the plugin family, served with stage processes: the ``tts`` stage process
    imports the plugin (the process backend hands it the list), so the stage comes up (``/readyz`` lists
    each stage's state; without the plugin it would fail to start: no registered family's checkpoint)."""
    from toy_family import write_toy

    d = tmp_path / "toy"
    write_toy(d, "tiny", 0, None)
    info = invoke("init-cascade", "--plugin", TOY, "--out", str(tmp_path / "m"), "--tts", str(d))
    served = Served(["--model", info["manifest"], "--processes", "--plugin", TOY], tmp_path / "log")
    try:
        deadline = time.monotonic() + 600
        while True:
            body = httpx.get(f"{served.base}/readyz", timeout=5).json()
            assert body["status"] != "failed", body
            state = body.get("stages", {}).get("tts")
            if state == "up":
                break
            assert state in (None, "starting") and time.monotonic() < deadline, served.log.read_text()[-3000:]
            time.sleep(1)
    finally:
        served.stop()


def test_a_plugin_family_speaks_as_the_cascade_tts_stage(tmp_path):
    """``init-cascade --plugin ... --tts TOY_DIR``: the cascade's ``tts`` stage runs the plugin family's
    runner, each clause's audio its tones resampled to the graph's 24 kHz."""
    from test_tts_stage import norm, tokens
    from toy_family import speech, write_toy

    from omniduplex.pipeline.config import ChunkingConfig, StageConfig
    from omniduplex.pipeline.messages import DecoderOutput, StageMessage
    from omniduplex.pipeline.stages.runner_tts import RunnerTTSStageWorker
    from omniduplex.pipeline.workers import build_worker

    d = tmp_path / "toy"
    write_toy(d, "tiny", 0, None)
    info = invoke("init-cascade", "--plugin", TOY, "--out", str(tmp_path / "m"), "--tts", str(d))
    w = build_worker("tts", info["manifest"], StageConfig(), ChunkingConfig())
    assert isinstance(w, RunnerTTSStageWorker) and w.runner.family == "toy-tone"
    reply = "Sure, the museum opens at nine and closes at six."
    outs = []
    for tok in tokens(reply):
        w.submit(StageMessage("1", {}, DecoderOutput(text=tok)))
        outs += w.step()
    w.submit(StageMessage("1", {}, DecoderOutput(text=""), last=True))
    while w.has_work():
        outs += w.step()
    chunks = outs[:-1]
    texts = [m.meta.text for m in chunks if m.meta.text]
    assert len(texts) >= 2 and norm("".join(texts)) == norm(reply)
    starts = [i for i, m in enumerate(chunks) if m.meta.text] + [len(chunks)]
    for a, b in zip(starts, starts[1:]):
        pcm = torch.cat([m.tensors["pcm"] for m in chunks[a:b]]).numpy()
        want = soxr.resample(speech(chunks[a].meta.text), 16000, 24000)
        assert pcm.shape == want.shape and np.abs(pcm - want).max() < 1e-4
