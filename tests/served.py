"""``omniduplex serve`` as a user runs it, for end-to-end tests: a child process started from the command line
with a scrubbed environment (every ``OMNIDUPLEX_*`` variable removed, so nothing the test session sets
changes what the server does), waited on until ``/readyz`` says ready, stopped with SIGTERM.

Its output goes to a log file (:meth:`Served.log`): a test may check that a request that looked fine left
no traceback behind (a failure swallowed on the way is how tool calls once went missing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from omniduplex.benchmarks.local_server import free_port


def scrubbed_env() -> dict[str, str]:
    """This process's environment without any ``OMNIDUPLEX_*`` variable (``PATH``, ``PYTHONPATH``, ``HOME``
    and the rest kept, so the child imports the same package and finds the same caches)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OMNIDUPLEX_")}


def moshi_tiny(folder: Path) -> Path:
    """A random ``moshi-tiny`` checkpoint written to ``folder`` by ``omniduplex init-model`` (returns it)."""
    cli = [sys.executable, "-m", "omniduplex.cli.main"]
    args = ["init-model", "--arch", "moshi-tiny", "--out", str(folder)]
    subprocess.run([*cli, *args], env=scrubbed_env(), check=True)
    return folder


class Served:
    """``omniduplex serve ARGS...`` on a free loopback port (a context manager).

    Args:
        args: ``serve``'s options (not ``--port``).
        ready_timeout_s: how long the stages may take to load before the start counts as failed (s).

    Raises:
        AssertionError: on enter, the server exited or was not ready in time (with its log's tail).
    """

    def __init__(self, *args: str, ready_timeout_s: float = 900.0) -> None:
        self.args, self.ready_timeout_s = list(args), ready_timeout_s
        self.port = free_port()
        self.log_path = Path(tempfile.mkdtemp(prefix="omniduplex-serve-")) / "serve.log"
        self.proc: subprocess.Popen | None = None

    def url(self, path: str = "", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def log(self) -> str:
        """Everything the server wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def start(self) -> Served:
        cmd = [sys.executable, "-m", "omniduplex.cli.main", "serve", "--port", str(self.port), *self.args]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, env=scrubbed_env(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise AssertionError(f"omniduplex serve exited ({code}):\n{self.log()[-4000:]}")
            try:
                if httpx.get(self.url("/readyz"), timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"omniduplex serve not ready in {self.ready_timeout_s:g} s:\n"
                                     f"{self.log()[-4000:]}")
            time.sleep(1.0)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (the server drains and stops its stages), SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Served:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
