"""An omniduplex app served by uvicorn in a background thread on a free loopback port, for benchmarks and
end-to-end tests that drive it with real clients from this process.

Stopping it runs uvicorn's whole shutdown (the app's lifespan stops every session and the stage processes)
and waits for it, so nothing is left behind when the benchmark or test exits.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """``app`` (a FastAPI app from ``create_app``) on ``http://127.0.0.1:<port>``, in a thread.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. ``loop`` is the server's event loop
    (e.g. for ``asyncio.run_coroutine_threadsafe``), ``state`` the app's ``ServerState``.

    Raises:
        RuntimeError: from :meth:`start`, when the server is not up within ``start_timeout_s``.
    """

    def __init__(self, app, start_timeout_s: float = 300.0, port: int | None = None, **uvicorn_kw) -> None:
        self.app, self.start_timeout_s = app, start_timeout_s
        self.port = port or free_port()
        kw = {"log_level": "warning", **uvicorn_kw}
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, **kw))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="local-server", daemon=True)

    @property
    def state(self):
        return self.app.state.server

    def url(self, path: str = "", scheme: str = "http") -> str:
        """``scheme://127.0.0.1:<port><path>``."""
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    def start(self) -> LocalServer:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {self.port} did not start")
            time.sleep(0.05)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Shut the server down (sessions, stage processes) and wait for it."""
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
