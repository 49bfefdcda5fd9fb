"""Graceful drain on SIGTERM/SIGINT: stop taking sessions, let the replies in flight finish, then shut down.

uvicorn's own shutdown closes every WebSocket before the app's lifespan ends, which would cut Realtime and
phone calls mid-reply. So the drain starts at the signal, in :class:`DrainingServer`:

1. the first signal marks the server ``draining``: new sessions are refused (503 / ``error`` event) on
   every surface, sessions already open go on;
2. it waits until no session has a reply in flight or committed-but-unanswered, or ``deadline_s`` passes;
3. then uvicorn's normal shutdown runs: connections close, the lifespan stops every session and the stage
   processes, and the relay unlinks its shared-memory segments.

A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import logging
import time

import uvicorn

log = logging.getLogger("omniduplex.drain")


def busy_sessions(state) -> list[str]:
    """Ids of the sessions with a reply in flight or a committed turn waiting for one."""
    return [
        sid
        for sid, s in list(state.sessions.items())
        if getattr(s, "session", None) is not None and s.session.busy
    ]


async def drain(state, deadline_s: float, poll_s: float = 0.1) -> bool:
    """Refuse new sessions and wait for the replies in flight; ``True`` when they all finished in time."""
    state.draining = True
    t_end = time.monotonic() + deadline_s
    busy = busy_sessions(state)
    log.info("draining: %d session(s) busy, deadline %.0f s", len(busy), deadline_s)
    while busy and time.monotonic() < t_end:
        await asyncio.sleep(poll_s)
        busy = busy_sessions(state)
    if busy:
        log.warning("drain deadline passed with %d reply(ies) in flight: %s", len(busy), ", ".join(busy))
    return not busy


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before its shutdown (see the module docstring).

    Args:
        config: the uvicorn config.
        state: the app's ``ServerState`` (``sessions``, ``draining``).
        deadline_s: longest wait for replies in flight (s).
    """

    def __init__(self, config: uvicorn.Config, state, deadline_s: float = 30.0) -> None:
        super().__init__(config)
        self.state, self.deadline_s = state, deadline_s
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig, frame) -> None:
        if self._drain_task is not None or self.should_exit:  # second signal: stop now
            return super().handle_exit(sig, frame)
        loop = asyncio.get_event_loop()
        self._drain_task = loop.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await drain(self.state, self.deadline_s)
        finally:
            self.should_exit = True
