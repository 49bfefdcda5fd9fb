"""Four stage processes joined by the relay: same output as in-process, cancellation, a killed stage."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from shm_leaks import left_behind
from turns import run_turn

from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.messages import TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.runtime.process_backend import ProcessBackend
from omniduplex.pipeline.workers import build_all
from omniduplex.relay import list_segments

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
QUESTION = ROOT / "examples" / "question.wav"
GREEDY = TurnOptions(
    sampling={"temperature": 0.0, "max_tokens": 8},
    talker_sampling={"temperature": 0.0, "max_tokens": 20},
)
# a 32 s reply that no codec EOS ends early: still running when it is cancelled or its stage killed
LONG = GREEDY.model_copy(
    update={"talker_sampling": {"temperature": 0.0, "max_tokens": 400, "ignore_eos": True}}
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=6)


def test_processes_equal_in_process_and_survive_a_killed_stage(ckpt):
    wav = load_audio(QUESTION)
    pcfg = PipelineConfig(model=str(ckpt))
    before = set(list_segments())

    async def local():
        orch = Orchestrator(LocalBackend(build_all(pcfg)), load_tokenizer(ckpt), record=True)
        await orch.start()
        try:
            return await run_turn(orch, wav, GREEDY)
        finally:
            await orch.stop()

    async def processes():
        backend = ProcessBackend(pcfg)
        orch = Orchestrator(backend, load_tokenizer(ckpt), record=True)
        await orch.start()
        try:
            first = await run_turn(orch, wav, GREEDY)
            # cancel mid-turn: the turn ends with an error event, nothing else is affected
            rid = orch.submit(wav, LONG)
            cancelled = []
            async for ev in orch.events(rid):
                cancelled.append(ev.kind)
                if ev.kind == "audio":
                    orch.cancel(rid)
            # kill the Talker mid-turn: in-flight turn errors, stage restarts, next turn succeeds
            rid = orch.submit(wav, LONG)
            crashed = []
            async for ev in orch.events(rid):
                crashed.append(ev)
                if ev.kind == "audio" and len(crashed) < 50:
                    backend.kill_stage("talker")
            after = await run_turn(orch, wav, GREEDY)
            return first, cancelled, crashed, after, dict(backend.restarts)
        finally:
            await orch.stop()

    ref_events, ref_record = asyncio.run(local())
    (events, record), cancelled, crashed, (after, after_record), restarts = asyncio.run(processes())
    assert record == ref_record
    pcm = np.concatenate([e.pcm for e in events if e.kind == "audio"])
    ref_pcm = np.concatenate([e.pcm for e in ref_events if e.kind == "audio"])
    np.testing.assert_allclose(pcm, ref_pcm, atol=1e-5)
    assert cancelled[-1] == "error" and "audio" in cancelled
    assert crashed[-1].kind == "error" and "talker" in crashed[-1].error
    assert restarts["talker"] == 1
    assert after[-1].kind == "done", after[-1].error
    assert after_record == ref_record
    assert left_behind(before) == set()  # no shared-memory segment left behind


def test_respond_cli_in_processes_writes_24k_wav_and_dump(ckpt, tmp_path):
    out, dump = tmp_path / "a.wav", tmp_path / "d.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "omniduplex.cli.main",
            "respond",
            "--input",
            str(ROOT / "examples" / "interrupt_48k_stereo.wav"),
            "--output",
            str(out),
            "--model",
            str(ckpt),
            "--greedy",
            "--processes",
            "--max-tokens",
            "6",
            "--talker-max-tokens",
            "12",
            "--dump-tokens",
            str(dump),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "TTFP" in r.stdout and "RTF" in r.stdout
    import json

    import soundfile as sf

    info = sf.info(str(out))
    assert info.samplerate == 24000 and info.frames > 0
    d = json.loads(dump.read_text())
    assert set(d) == {"prompt_token_ids", "text_token_ids", "codes"}
    assert 0 < len(d["codes"]) <= 11


def test_respond_cli_rejects_unreadable_audio(tmp_path, ckpt):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF not really a wav")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "omniduplex.cli.main",
            "respond",
            "--input",
            str(bad),
            "--output",
            str(tmp_path / "o.wav"),
            "--model",
            str(ckpt),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "cannot read" in r.stderr
    assert not (tmp_path / "o.wav").exists()
