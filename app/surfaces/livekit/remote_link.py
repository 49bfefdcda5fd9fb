"""One logical connection to an omniduplex server's ``/v1/realtime`` that outlives the server's restarts.

The link connects (``websockets`` client, ``Authorization: Bearer <key>`` when a key is set), waits for
``session.created``, hands it to ``on_connected`` (which re-sends the session's configuration and history),
then pumps events both ways, typed: client event models out
(:func:`~omniduplex.app.surfaces.wire.realtime.protocol.client_event_json`), server events in, parsed into
their models
(:func:`~omniduplex.app.surfaces.wire.realtime.protocol.parse_server_event`; event types we do not model are
skipped, a
malformed event is logged and skipped). A first event other than ``session.created`` (an ``error``: the
server is full or its stages are not ready, then a close 1013) counts as a failed attempt.

When a connection fails or drops it calls ``on_down`` at once (the owner fails what was in flight: nothing
waits on a dead socket) and reconnects after :meth:`RetryPolicy.delay`; after ``give_up_after_s`` of
consecutive failure it calls ``on_give_up`` and stops. Events sent while down are dropped
(:meth:`RealtimeLink.send` returns False): stale microphone audio is worth nothing later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection, connect

from omniduplex.app.surfaces.wire.realtime.client_events import ClientEvent
from omniduplex.app.surfaces.wire.realtime.protocol import client_event_json, parse_server_event
from omniduplex.app.surfaces.wire.realtime.server_events import ServerEvent, SessionCreated

log = logging.getLogger("omniduplex.livekit")


@dataclass
class RetryPolicy:
    """Reconnection schedule (seconds): attempt ``k`` (0-based) waits ``min(max_delay_s, initial_s·2^k)``;
    ``give_up_after_s`` of consecutive failure ends the link (``None``: retry forever);
    ``connect_timeout_s`` bounds one attempt up to ``session.created``."""

    initial_s: float = 0.5
    max_delay_s: float = 8.0
    give_up_after_s: float | None = 180.0
    connect_timeout_s: float = 10.0

    def delay(self, attempt: int) -> float:
        return min(self.max_delay_s, self.initial_s * 2**attempt)


class RealtimeLink:
    """See the module docstring.

    Args:
        url: ``ws://host:port/v1/realtime`` (``http(s)://`` is accepted and mapped to ``ws(s)://``).
        api_key: sent as ``Authorization: Bearer``; ``None`` for a server without keys.
        policy: reconnection schedule.
        on_event: each server event (a model of :mod:`omniduplex.app.surfaces.wire.realtime.server_events`),
        in order.
        on_connected: awaited with ``session.created`` after each (re)connection, before other events.
        on_down: called with the error each time a connection attempt fails or a live connection ends.
        on_give_up: called once with the last error when ``policy.give_up_after_s`` is exhausted.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None,
        policy: RetryPolicy,
        on_event: Callable[[ServerEvent], None],
        on_connected: Callable[[SessionCreated], Awaitable[None]],
        on_down: Callable[[Exception], None],
        on_give_up: Callable[[Exception], None],
    ) -> None:
        self.url = url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        self.api_key, self.policy = api_key, policy
        self.on_event, self.on_connected, self.on_down, self.on_give_up = (
            on_event,
            on_connected,
            on_down,
            on_give_up,
        )
        self.attempts = 0  # connection attempts so far (tests, logs)
        self.connections = 0  # successful connections so far
        self._out: asyncio.Queue[str] | None = None  # the live connection's send queue
        self._task: asyncio.Task | None = None
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._out is not None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="omniduplex-realtime-link")

    def send(self, event: ClientEvent) -> bool:
        """Queue a client event on the live connection; False (dropped) while disconnected."""
        if self._out is None:
            return False
        self._out.put_nowait(client_event_json(event))
        return True

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        attempt, down_since = 0, None
        while not self._closed:
            self.attempts += 1
            before = self.connections
            try:
                await self._connection()
                err: Exception = ConnectionError("the server closed the realtime connection")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # refused, reset, timed out, rejected: all mean "down for now"
                err = e
            self._out = None
            if self.connections > before:  # it was up: this failure starts a new outage
                attempt, down_since = 0, None
            if self._closed:
                return
            now = time.monotonic()
            down_since = down_since or now
            self.on_down(err)
            give_up = self.policy.give_up_after_s
            if give_up is not None and now - down_since >= give_up:
                self.on_give_up(err)
                return
            delay = self.policy.delay(attempt)
            attempt += 1
            log.warning(
                "realtime server %s unavailable (%s); retry %d in %.1f s", self.url, err, attempt, delay
            )
            await asyncio.sleep(delay)

    async def _connection(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        timeout = self.policy.connect_timeout_s
        async with connect(self.url, additional_headers=headers, open_timeout=timeout, max_size=None) as ws:
            raw = await asyncio.wait_for(ws.recv(), timeout)
            first = parse_server_event(raw)
            if not isinstance(first, SessionCreated):  # e.g. an error: the server is full or not ready yet
                raise ConnectionError(f"expected session.created, got {str(raw)[:300]}")
            self.connections += 1
            self._out = asyncio.Queue()
            await self.on_connected(first)
            await self._serve(ws, self._out)

    async def _serve(self, ws: ClientConnection, out: asyncio.Queue[str]) -> None:
        async def writer() -> None:
            while True:
                await ws.send(await out.get())

        sender = asyncio.get_running_loop().create_task(writer())
        try:
            async for raw in ws:  # ends when the connection closes (cleanly or not)
                try:
                    event = parse_server_event(raw)
                except ValueError as e:
                    log.warning("malformed realtime server event skipped: %s", e)
                    continue
                if event is None:
                    continue
                try:
                    self.on_event(event)
                except Exception:
                    log.exception("realtime event handler failed")
            if sender.done() and sender.exception() is not None:
                raise sender.exception()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
