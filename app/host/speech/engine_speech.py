"""The plumbing every engine-backed speech service shares: one continuous-batching engine for all requests,
stepped on a worker thread, each request's events turned into audio pieces by its own streaming decoder and
handed to the request's event loop.

A service (:class:`EngineSpeech`) gives the three family-specific parts: :meth:`~EngineSpeech._add` (queue a
checked request on the engine), :meth:`~EngineSpeech._decoder` (a request's decoder state) and
:meth:`~EngineSpeech._pieces` (one engine event → float32 pieces). Qwen3-TTS (:mod:`.qwen3`) and the engine
families (:mod:`.family`) are built on it. A request the engine refuses once queued ends its stream with
:class:`~.contract.SpeechError`; a failing step fails the requests in flight and the thread keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from omniduplex.app.host.speech.contract import SpeechError, SpeechService

log = logging.getLogger("omniduplex.speech")


class _Job:
    """One request's output queue (filled from the worker thread) and decoder state."""

    def __init__(self, loop: asyncio.AbstractEventLoop, decoder: Any) -> None:
        self.loop, self.decoder, self.queue = loop, decoder, asyncio.Queue()

    def put(self, item) -> None:
        with contextlib.suppress(RuntimeError):  # the request's event loop is closed: nobody listens
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class EngineSpeech(SpeechService):
    """A speech service over one engine (``add / abort / has_unfinished / step``) on a worker thread.

    Subclasses set :attr:`engine` and call :meth:`_start` at the end of ``__init__``."""

    engine: Any

    def _start(self, name: str) -> None:
        self._cv = threading.Condition()
        self._incoming: list[tuple[str, Any, _Job]] = []
        self._aborts: list[str] = []
        self._closed = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @abstractmethod
    def _add(self, request_id: str, prepared: Any) -> None:
        """Queue a :meth:`prepare` result on the engine (worker thread). Raises ValueError / SpeechError."""

    @abstractmethod
    def _decoder(self, prepared: Any) -> Any:
        """A fresh decoder state for one request."""

    @abstractmethod
    def _pieces(self, decoder: Any, event: Any) -> list[np.ndarray]:
        """The float32 pieces ``[n]`` at :attr:`sample_rate` one engine event completes (all of the rest when
        the event finishes the request)."""

    async def stream(self, prepared: Any) -> AsyncIterator[np.ndarray]:
        """Speak ``prepared``: float32 pieces ``[n]`` as the decoder completes them. Leaving the iteration
        early (client gone) aborts the request.

        Raises SpeechError: the engine refused the request once queued (before any audio)."""
        rid = f"speech-{next(self._ids)}"
        job = _Job(asyncio.get_running_loop(), self._decoder(prepared))
        with self._cv:
            self._incoming.append((rid, prepared, job))
            self._cv.notify()
        done = False
        try:
            while True:
                item = await job.queue.get()
                if item is None:
                    done = True
                    return
                if isinstance(item, Exception):
                    done = True
                    raise item
                yield item
        finally:
            if not done:
                with self._cv:
                    self._aborts.append(rid)
                    self._cv.notify()

    def close(self) -> None:
        """Stop the worker thread (requests in flight get no more audio)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # -- worker thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        jobs: dict[str, _Job] = {}
        while True:
            with self._cv:
                while not (self._closed or self._incoming or self._aborts or self.engine.has_unfinished()):
                    self._cv.wait()
                if self._closed:
                    return
                incoming, self._incoming = self._incoming, []
                aborts, self._aborts = self._aborts, []
            for rid in aborts:
                if jobs.pop(rid, None) is not None:
                    self.engine.abort(rid)
            for rid, prepared, job in incoming:
                try:
                    self._add(rid, prepared)
                    jobs[rid] = job
                except SpeechError as e:
                    job.put(e)
                except ValueError as e:
                    job.put(SpeechError(str(e), "input"))
            if not self.engine.has_unfinished():
                continue
            try:
                for ev in self.engine.step():
                    job = jobs.get(ev.request_id)
                    if job is None:
                        continue
                    for p in self._pieces(job.decoder, ev):
                        job.put(p)
                    if ev.finished:
                        job.put(None)
                        del jobs[ev.request_id]
            except Exception as e:  # a bug: fail the requests in flight, keep serving new ones
                log.exception("%s step failed", type(self).__name__)
                for rid, job in jobs.items():
                    self.engine.abort(rid)
                    job.put(RuntimeError(f"speech generation failed: {e}"))
                jobs.clear()
