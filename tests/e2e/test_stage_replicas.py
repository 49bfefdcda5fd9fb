"""Stage replicas (``replicas: 2`` on both stages of the Qwen3-TTS graph, real stage processes): concurrent
utterances give the audio of one replica each, both replicas of each stage get requests, and killing one
replica's process fails only the requests pinned to it while the others run to their end; the next request
succeeds on the restarted replica. A bad ``replicas`` value is refused naming its key."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omniduplex.models.qwen3_tts.model import load_qwen3_tts
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
from omniduplex.pipeline.config import GraphConfigError, PipelineConfig, load_graph
from omniduplex.pipeline.messages import TurnOptions, UtteranceRequest
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.runtime.process_backend import ProcessBackend
from omniduplex.pipeline.runtime.replicas import ReplicaPlan
from omniduplex.pipeline.workers import build_all

FRAMES = 30
TEXTS = ("Hello there, how are you today?", "The weather is fine.")
STAGES = ("tts_talker", "tts_codec")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tts_checkpoint(tmp_path_factory.mktemp("q3tts_replicas") / "cv", "tiny", 0, "custom_voice")


def _greedy(n: int) -> dict:
    return {"temperature": 0.0, "max_tokens": n + 1, "ignore_eos": True}


def _config(ckpt, replicas: int) -> PipelineConfig:
    return PipelineConfig(
        model=str(ckpt), stages={s: {"num_kv_blocks": 64, "replicas": replicas} for s in STAGES}
    )


async def _speak(orch: Orchestrator, text: str, voice: str, frames: int = FRAMES) -> list:
    rid = orch.speak(UtteranceRequest(text=text, turn=TurnOptions(voice=voice, sampling=_greedy(frames))))
    return [ev async for ev in orch.events(rid)]


def _pcm(events: list) -> np.ndarray:
    assert events[-1].kind == "done", events[-1]
    return np.concatenate([e.pcm for e in events if e.kind == "audio"])


def test_replicas_key_is_validated(tmp_path):
    for bad in ("0", "two", "1.5"):
        path = tmp_path / "g.yaml"
        path.write_text(f"stages:\n  tts_codec:\n    replicas: {bad}\n")
        with pytest.raises(GraphConfigError, match=r"stages\.tts_codec\.replicas"):
            load_graph(path)


def test_replica_pins_round_trip(ckpt):
    stages = {"tts_talker": {"replicas": 3}, "tts_codec": {"replicas": 2}}
    plan = ReplicaPlan(PipelineConfig(model=str(ckpt), stages=stages))
    assert plan.instances("tts_talker") == ["tts_talker@0", "tts_talker@1", "tts_talker@2"]
    for n in (1, 7):
        for a in range(3):
            for b in range(2):
                rid = plan.rid(n, {"tts_talker": a, "tts_codec": b})
                assert (plan.replica_of(rid, "tts_talker"), plan.replica_of(rid, "tts_codec")) == (a, b)
    live = {"tts_talker@0": 2, "tts_talker@1": 1, "tts_talker@2": 1, "tts_codec@0": 1}
    assert plan.choose(live) == {"tts_talker": 1, "tts_codec": 1}
    up = {"tts_talker@0", "tts_talker@2", "tts_codec@0"}  # down replicas get no new request
    assert plan.choose(live, up) == {"tts_talker": 2, "tts_codec": 0}
    assert plan.choose(live, {"tts_talker@0"}) == {"tts_talker": 0, "tts_codec": 1}  # none up: all
    one = ReplicaPlan(PipelineConfig(model=str(ckpt)))
    assert one.all_instances() == list(STAGES) and one.rid(5, {}) == 5


@pytest.mark.slow
def test_two_replicas_equal_one_and_a_dead_replica_fails_only_its_requests(ckpt):
    voices = sorted(load_qwen3_tts(ckpt).config.speakers)[:2]
    jobs = [(t, v) for t in TEXTS for v in voices]

    async def run(backend, extra):
        orch = Orchestrator(backend, None, output_rate=24000)
        await orch.start()
        try:
            runs = await asyncio.gather(*(_speak(orch, t, v) for t, v in jobs))
            return runs, (await extra(orch, backend) if extra else None)
        finally:
            await orch.stop()

    async def kill_one(orch, backend):
        stats = backend.stats()
        done = {}

        async def long(frames, kill):
            rid = orch.speak(
                UtteranceRequest(text=TEXTS[0], turn=TurnOptions(voice=jobs[0][1], sampling=_greedy(frames)))
            )
            events, audio_after_kill = [], 0
            async for ev in orch.events(rid):
                events.append(ev)
                if ev.kind == "audio":
                    if "killed" in done:
                        audio_after_kill += 1
                    elif kill and sum(e.kind == "audio" for e in events) == 2:
                        victim = backend.plan.instance_for(backend.ids[rid], "tts_talker")
                        backend.kill_stage(victim)
                        done["killed"] = victim
            return events, audio_after_kill

        (kept, kept_after), (lost, _) = await asyncio.gather(long(400, False), long(4000, True))
        for _ in range(600):  # the killed replica restarts without stopping the others
            if backend.ready:
                break
            await asyncio.sleep(0.1)
        after = await asyncio.gather(_speak(orch, *jobs[0]), _speak(orch, *jobs[0]))  # one on each replica
        return stats, done["killed"], kept, kept_after, lost, after, backend.stats()

    # the reference: every stage in one process (one replica each; the stage processes at replicas: 1
    # equal it: tests/test_qwen3_tts_graph.py)
    ref, _ = asyncio.run(run(LocalBackend(build_all(_config(ckpt, 1))), None))
    runs, (stats, victim, kept, kept_after, lost, after, stats_after) = asyncio.run(
        run(ProcessBackend(_config(ckpt, 2)), kill_one)
    )
    for events, ref_events in zip(runs, ref):
        np.testing.assert_allclose(_pcm(events), _pcm(ref_events), rtol=0, atol=1e-5)
    for s in STAGES:  # four requests, least-loaded first: two on each replica
        assert [stats["replicas"][f"{s}@{i}"]["assigned"] for i in (0, 1)] == [2, 2]
        assert {f"{s}@0", f"{s}@1"} <= set(stats["stages"])
    replica = victim.rpartition("@")[2]
    assert lost[-1].kind == "error" and f"tts_talker replica {replica} died" in lost[-1].error
    assert kept[-1].kind == "done" and kept_after > 0  # the other replica's request ran to its end
    assert stats_after["restarts"][victim] == 1
    for events in after:
        np.testing.assert_allclose(_pcm(events), _pcm(ref[0]), rtol=0, atol=1e-5)
    assert all(stats_after["replicas"][f"tts_talker@{i}"]["assigned"] == 4 for i in (0, 1))
    assert all(r["live"] == 0 for r in stats_after["replicas"].values())
