"""``omniduplex serve`` as a service, with the tiny model in stage processes: readiness, stage gauges in
``/metrics``, an idle server that stays (nearly) off the CPU, start-up errors that name their cause."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load_file, save_file

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import free_port
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.runtime.process_backend import ProcessBackend, StageStartError

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
QUESTION = ROOT / "examples" / "question.wav"
IDLE_CPU_BOUND = 0.02
"""An idle server (no session), with all its stage processes, uses less than this share of one core."""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=4)


@pytest.fixture(scope="module")
def broken_ckpt(tmp_path_factory):
    """The tiny checkpoint without one Talker tensor: only the talker stage fails to load."""
    d = write_checkpoint(tmp_path_factory.mktemp("broken"), "tiny", seed=4)
    tensors = load_file(d / "model.safetensors")
    del tensors["talker.codec_head.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    return d


def test_readyz_waits_for_every_stage_and_metrics_show_them(ckpt):
    cfg = ServerConfig(model=str(ckpt), processes=True, start_in_background=True)

    async def main():
        app = create_app(cfg)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                first = await client.get("/readyz")
                health = await client.get("/healthz")
                deadline = time.monotonic() + 300  # four stage processes load on a possibly busy machine
                while (r := await client.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                backend = app.state.server.orchestrator.backend
                up_when_ready = set(backend.up), set(backend.topo.all_stages)
                while len(backend.stage_stats) < len(backend.procs) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)  # each stage reports its stats once, soon after ready
                metrics = await client.get("/metrics")
                return first, health, r, up_when_ready, metrics.text

    first, health, ready, (up, stages), text = asyncio.run(main())
    assert health.status_code == 200
    assert first.status_code == 503 and first.json()["status"] == "starting"
    assert ready.status_code == 200 and up == stages, ready.json()
    samples = {
        (s.name, s.labels.get("stage") or s.labels.get("edge")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    for stage in stages:
        assert samples[("omniduplex_stage_up", stage)] == 1
        assert samples[("omniduplex_stage_restarts_total", stage)] == 0
        assert samples[("omniduplex_stage_queue_depth", stage)] == 0
    for stage in ("thinker", "talker"):
        assert samples[("omniduplex_stage_kv_blocks_free", stage)] > 0
        assert samples[("omniduplex_stage_kv_blocks_used", stage)] == 0
    assert samples[("omniduplex_relay_slots", "orchestrator->encoder")] > 0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids`` (s), from ``/proc/<pid>/stat``."""
    ticks = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def test_idle_server_with_stage_processes_stays_off_the_cpu(ckpt):
    """Resource bound, not a latency: the server and its stage processes block on their sockets when idle."""
    port = free_port()
    cmd = [sys.executable, "-m", "omniduplex.cli.main", "serve", "--model", str(ckpt), "--processes"]
    proc = subprocess.Popen([*cmd, "--port", str(port), "--log-level", "warning"])
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, "the server exited"
            time.sleep(0.5)
        time.sleep(2.0)  # start-up work settles (first stats reports, imports)
        pids = _descendants(proc.pid)
        assert len(pids) >= 5  # the server and its stage processes
        c0, t0 = _cpu_seconds(pids), time.monotonic()
        time.sleep(10.0)
        c1, t1 = _cpu_seconds(_descendants(proc.pid)), time.monotonic()
        share = (c1 - c0) / (t1 - t0)
        assert share < IDLE_CPU_BOUND, f"idle server used {100 * share:.1f} % of a core"
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_stage_that_fails_to_start_names_its_cause(broken_ckpt):
    backend = ProcessBackend(PipelineConfig(model=str(broken_ckpt)))
    with pytest.raises(StageStartError) as err:
        backend.start(lambda source, msg: None)
    e = err.value
    assert e.stage == "talker" and e.cause.startswith("CheckpointError: ")
    assert "missing tensor 'talker.codec_head.weight'" in str(e)
    assert not any(p.is_alive() for p in backend.procs.values())  # nothing is left running


def test_cli_prints_a_start_up_error_on_one_line(broken_ckpt):
    cmd = [sys.executable, "-m", "omniduplex.cli.main", "respond", "--model", str(broken_ckpt)]
    r = subprocess.run(
        [*cmd, "-i", str(QUESTION)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: StageStartError: stage talker failed to start: CheckpointError: ")
    assert "talker.codec_head.weight" in last
