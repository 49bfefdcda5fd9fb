"""The unified graph as three stage processes joined by the relay: the same turn as in-process (CFG on),
a killed codec stage fails only the turn in flight, and no shared-memory segment is left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from shm_leaks import left_behind
from turns import run_turn

from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.models.unified.presets import write_unified_checkpoint
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.messages import TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.runtime.process_backend import ProcessBackend
from omniduplex.pipeline.topology import output_rate
from omniduplex.pipeline.workers import build_all
from omniduplex.relay import list_segments

pytestmark = pytest.mark.slow
QUESTION = Path(__file__).parents[2] / "examples" / "question.wav"
META = TurnOptions(max_text_tokens=4, max_audio_frames=12, cfg_scale=3.0, sampling={"temperature": 0.0})


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_unified_checkpoint(tmp_path_factory.mktemp("unified"), "tiny", seed=3)





def test_unified_processes_equal_in_process_and_survive_a_killed_codec(ckpt):
    wav = load_audio(QUESTION)
    pcfg = PipelineConfig(model=str(ckpt))
    rate = output_rate(ckpt)
    before = set(list_segments())

    async def local():
        orch = Orchestrator(
            LocalBackend(build_all(pcfg)), load_tokenizer(ckpt), record=True, output_rate=rate
        )
        await orch.start()
        try:
            return await run_turn(orch, wav, META)
        finally:
            await orch.stop()

    async def processes():
        backend = ProcessBackend(pcfg)
        orch = Orchestrator(backend, load_tokenizer(ckpt), record=True, output_rate=rate)
        await orch.start()
        try:
            assert set(backend.procs) == {"codec_encoder", "unified", "codec"}
            first = await run_turn(orch, wav, META)
            rid = orch.submit(wav, META.model_copy(update={"max_audio_frames": 2000}))
            killed = None
            async for ev in orch.events(rid):
                if ev.kind == "audio" and killed is None:
                    killed = True
                    backend.kill_stage("codec")
            after_kill = ev
            again = await run_turn(orch, wav, META)
            return first, after_kill, again, dict(backend.restarts)
        finally:
            await orch.stop()

    ref_events, ref_record = asyncio.run(local())
    (events, record), after_kill, (again, again_record), restarts = asyncio.run(processes())
    assert events[-1].kind == "done" and ref_events[-1].kind == "done"
    assert record == ref_record and len(record["codes"]) == 12  # the frame budget
    pcm = np.concatenate([e.pcm for e in events if e.kind == "audio"])
    ref_pcm = np.concatenate([e.pcm for e in ref_events if e.kind == "audio"])
    np.testing.assert_allclose(pcm, ref_pcm, atol=1e-6, rtol=0)
    assert "".join(e.text for e in events if e.kind == "text") == "".join(
        e.text for e in ref_events if e.kind == "text"
    )
    assert after_kill.kind == "error" and "codec" in after_kill.error
    assert restarts["codec"] == 1
    assert again[-1].kind == "done" and again_record == ref_record
    assert left_behind(before) == set()
