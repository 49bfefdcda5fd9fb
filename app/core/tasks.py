"""The background tasks of one call (or of a UAS): started by name, kept until they end, cancelled together
when the call closes. Every surface's call runs a few (a pacer, a reader, a watchdog, a close)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Tasks:
    """Tasks named ``{prefix}-{name}``, held while they run (asyncio keeps only weak references)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.running: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self.running)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of the running loop."""
        t = asyncio.get_running_loop().create_task(coro, name=f"{self.prefix}-{name}")
        self.running.add(t)
        t.add_done_callback(self.running.discard)
        return t

    async def cancel(self) -> None:
        """Cancel every task but the one calling this (a task may close its own call) and wait until they
        have ended."""
        current = asyncio.current_task()
        others = [t for t in self.running if t is not current]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)
