"""SIGTERM to ``omniduplex serve`` while its stage processes are still loading (default cascade, scrubbed
environment: tests/served.py): there is nothing to drain, so the start is abandoned at once — one log line
says so, the stage processes are killed, and the server exits 0 without waiting for the models to load
(README "Drain"). The neighbour, tests/e2e/test_sigterm_drain.py, sends it mid-reply."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest
from served import scrubbed_env
from test_sigterm_drain import _alive, _descendants, _segments_of

from omniduplex.benchmarks.local_server import free_port

pytestmark = pytest.mark.slow


def test_sigterm_while_the_stages_load_abandons_the_start_and_exits_0(tmp_path):
    port, log_path = free_port(), tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "omniduplex.cli.main", "serve", "--port", str(port)]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, env=scrubbed_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, stages, ready = time.monotonic() + 120, [], None
        while not stages or ready is None:  # the HTTP side is up and the stage processes exist
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
            stages = _descendants(proc.pid)
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
            except httpx.HTTPError:
                ready = None
        assert ready.status_code == 503 and ready.json()["status"] == "starting", ready.text
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert rc == 0, log[-3000:]
    assert "stopping while the pipeline is still starting: the start is abandoned" in log, log[-3000:]
    assert "pipeline start abandoned: start abandoned (the server is stopping)" in log, log[-3000:]
    assert "Traceback" not in log and "failed to start" not in log, log[-3000:]
    assert not _alive(stages), "stage processes left running"
    assert _segments_of([proc.pid, *stages]) == []
