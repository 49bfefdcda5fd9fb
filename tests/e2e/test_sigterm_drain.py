"""SIGTERM to ``omniduplex serve`` mid-reply (default cascade, stage processes): the reply in flight finishes
(``response.done`` completed), new sessions are refused while it drains, /readyz says ``draining``, and the
process then exits 0 with its stage processes gone and no shared-memory segment left."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest
import websockets

from omniduplex.benchmarks.local_server import free_port
from omniduplex.relay.shm_pool import list_segments

pytestmark = pytest.mark.slow


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


async def _events_until(ws, kind: str, timeout: float = 60.0) -> list[dict]:
    out = []
    async with asyncio.timeout(timeout):
        while True:
            ev = json.loads(await ws.recv())
            out.append(ev)
            if ev["type"] == kind:
                return out


async def _scenario(port: int, proc: subprocess.Popen) -> dict:
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    async with websockets.connect(url) as ws:
        await _events_until(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Tell me a story about a red fox."}],
                    },
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        await _events_until(ws, "response.output_audio.delta")
        proc.send_signal(signal.SIGTERM)
        async with httpx.AsyncClient() as http, asyncio.timeout(30):
            while (ready := await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                await asyncio.sleep(0.02)  # until the signal is handled; /readyz then says why not ready
        refused = None
        try:
            async with websockets.connect(url) as late:
                refused = json.loads(await asyncio.wait_for(late.recv(), 10))
        except websockets.exceptions.ConnectionClosed as e:  # a close without an error event also refuses
            refused = {"closed": e.rcvd.code if e.rcvd else None}
        rest = await _events_until(ws, "response.done")
    return {
        "ready": ready,
        "refused": refused,
        "done": rest[-1],
        "deltas": sum(e["type"] == "response.output_audio.delta" for e in rest),
    }


def _start_server() -> tuple[subprocess.Popen, int]:
    """``omniduplex serve`` (default cascade) in a child process, once /readyz says ready."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "omniduplex.cli.main", "serve", "--port", str(port), "--max-tokens", "40"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server not ready: {proc.stdout.read()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def _segments_of(pids: list[int]) -> list[str]:
    """Relay segments in /dev/shm owned by ``pids`` (their names carry the owner's pid); other processes on
    the machine (another pipeline, another test run) may own segments of their own meanwhile."""
    return [name for pid in pids for name in list_segments(pid=pid)]


def _alive(pids: list[int], wait_s: float = 20.0) -> list[int]:
    """The processes of ``pids`` still running after up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for p in pids:
            try:
                if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def test_sigterm_finishes_the_reply_in_flight_refuses_new_sessions_and_exits_clean():
    proc, port = _start_server()
    try:
        stages = _descendants(proc.pid)
        assert stages, "no stage process"
        r = asyncio.run(_scenario(port, proc))
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stdout.read()
    assert r["done"]["response"]["status"] == "completed", (r, log[-3000:])
    assert r["deltas"] > 0
    assert r["ready"].status_code == 503 and r["ready"].json()["status"] == "draining"
    assert r["refused"].get("type") == "error" or "closed" in r["refused"], r["refused"]
    assert rc == 0, log[-3000:]
    assert not _alive(stages)
    assert _segments_of([proc.pid, *stages]) == []


def test_stage_processes_exit_when_the_server_is_killed_outright():
    """SIGKILL (an OOM kill) gives the server no chance to stop its stages: they notice and exit, and take
    their shared-memory segments with them."""
    proc, _ = _start_server()
    stages = _descendants(proc.pid)
    assert stages
    proc.kill()
    proc.wait()
    assert not _alive(stages), "orphaned stage processes"
    assert _segments_of([proc.pid, *stages]) == []
