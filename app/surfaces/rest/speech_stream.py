"""``WS /v1/audio/speech/stream``: text streamed in (e.g. from the client's own LLM), speech streamed back
clause by clause, over the host's speech service (Piper, Qwen3-TTS, or any other
:class:`~omniduplex.app.host.speech.contract.SpeechService`). The wire format: :mod:`..wire.speech_stream`.

One :class:`SpeechStream` per socket runs two tasks: the reader parses messages and cuts the text into
clauses (:class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`, as the cascade's TTS stage), queueing each
complete clause; the speaker speaks the queue in order, one clause at a time, each as one speech request
(:meth:`~.SpeechService.prompt` then :meth:`~.SpeechService.stream`), sending its pieces as they come. A
``cancel`` cancels the clause being spoken (leaving the service's stream aborts the request) and empties the
queue before ``cancelled`` is sent, so no audio of a dropped clause follows it. A client that goes away stops
both tasks the same way: nothing is left running for it.

Limits: the edge gate (:mod:`omniduplex.app.host.auth`) authenticates the upgrade, counts it against the
per-address connection rate and the per-key sessions; a draining server refuses new streams (close 1013);
messages are capped by uvicorn's ``ws_max_size``, text by :data:`~..wire.speech_stream.MAX_TEXT_CHARS` a
message and :data:`~..wire.speech_stream.MAX_PENDING_CHARS` unspoken. A stream is not a conversation
session: it holds no pipeline slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from fastapi import APIRouter, WebSocket

from omniduplex.app.host.readiness import CLOSE_TRY_AGAIN_LATER, close_reason
from omniduplex.app.host.speech.contract import SpeechError, SpeechService
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.wire import speech_stream as wire
from omniduplex.pipeline.text.clauses import ClauseSplitter

log = logging.getLogger("omniduplex.speech_stream")

CLOSE_POLICY = 1008
"""WebSocket close code "Policy Violation" (RFC 6455 §7.4.1): a query parameter the server cannot serve."""


class SpeechStream:
    """One ``/v1/audio/speech/stream`` socket (see the module docstring).

    Args:
        ws: the accepted WebSocket.
        service: the speech service every clause is spoken by.
        fmt: ``pcm`` (binary frames) or ``base64`` (``audio`` events).
    """

    def __init__(self, ws: WebSocket, service: SpeechService, fmt: str = "pcm") -> None:
        self.ws, self.service, self.fmt = ws, service, fmt
        self.splitter = ClauseSplitter()
        self.voice: dict = {}  # session.update fields
        self.queue: asyncio.Queue[tuple[int, str, dict] | None] = asyncio.Queue()  # None: end of input
        self.queued_chars = 0
        self.ended = False
        self.ids = itertools.count()
        self.current: tuple[int, asyncio.Task] | None = None  # the clause being spoken
        self._send_lock = asyncio.Lock()

    async def run(self) -> None:
        """Serve the socket until ``end`` has been spoken, the client goes away, or a send fails."""
        rate = self.service.sample_rate
        await self._send(wire.event("session.created", sample_rate=rate, format="pcm_s16le", channels=1))
        reader = asyncio.create_task(self._read(), name="speech-stream-read")
        speaker = asyncio.create_task(self._speak(), name="speech-stream-speak")
        try:
            await asyncio.wait({reader, speaker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (reader, speaker):
                t.cancel()
            await asyncio.gather(reader, speaker, return_exceptions=True)

    async def _send(self, data: str | bytes) -> None:
        async with self._send_lock:
            if isinstance(data, bytes):
                await self.ws.send_bytes(data)
            else:
                await self.ws.send_text(data)

    # -- reader -----------------------------------------------------------------------------------------
    async def _read(self) -> None:
        while True:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            raw = msg.get("text") if msg.get("text") is not None else msg.get("bytes") or b""
            try:
                ev = wire.parse(raw)
                await self._handle(ev)
            except wire.WireError as e:
                await self._send(wire.error_event(str(e), e.code, e.param))

    async def _handle(self, ev: wire.ClientEvent) -> None:
        if isinstance(ev, wire.Cancel):
            await self._cancel()
            return
        if self.ended:
            raise wire.WireError("the input has ended: only cancel is accepted now", "input_ended", "type")
        if isinstance(ev, wire.SessionUpdate):
            self.voice.update(ev.fields)
        elif isinstance(ev, wire.Text):
            pending = len(self.splitter.buf) + self.queued_chars + len(ev.text)
            if pending > wire.MAX_PENDING_CHARS:
                raise wire.WireError(
                    f"{pending} characters would wait unspoken, over {wire.MAX_PENDING_CHARS}: "
                    "wait for audio before sending more",
                    "buffer_full",
                    "text",
                )
            await self._queue(self.splitter.push(ev.text))
        elif isinstance(ev, wire.Flush):
            await self._queue(self.splitter.flush())
        elif isinstance(ev, wire.End):
            await self._queue(self.splitter.flush())
            self.ended = True
            self.queue.put_nowait(None)

    async def _queue(self, clauses: list[str]) -> None:
        for text in clauses:
            cid = next(self.ids)
            await self._send(wire.event("clause.created", clause=cid, text=text))
            self.queue.put_nowait((cid, text, dict(self.voice)))
            self.queued_chars += len(text)

    async def _cancel(self) -> None:
        """Drop the buffered text, the queue and the clause being spoken, then send ``cancelled``."""
        dropped, end = [], False
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item is None:
                end = True
            else:
                dropped.append(item[0])
        self.queued_chars, self.splitter = 0, ClauseSplitter()
        if self.current is not None:
            cid, task = self.current
            task.cancel()
            await asyncio.wait({task})
            dropped.insert(0, cid)
        await self._send(wire.event("cancelled", clauses=dropped))
        if end:  # cancelled after ``end``: nothing left to say, the speaker still says ``done``
            self.queue.put_nowait(None)

    # -- speaker ----------------------------------------------------------------------------------------
    async def _speak(self) -> None:
        try:
            while (item := await self.queue.get()) is not None:
                cid, text, voice = item
                self.queued_chars -= len(text)
                task = asyncio.create_task(self._say(cid, text, voice), name=f"speech-stream-clause-{cid}")
                self.current = (cid, task)
                await asyncio.wait({task})
                self.current = None
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # the socket failed: stop serving it
            await self._send(wire.event("done"))
            with contextlib.suppress(Exception):  # the client may close first
                await self.ws.close(code=1000)
        finally:
            if self.current is not None:  # the socket is going away mid-clause
                self.current[1].cancel()
                await asyncio.wait({self.current[1]})

    async def _say(self, cid: int, text: str, voice: dict) -> None:
        """Speak one clause: its audio, then ``clause.done`` (or an ``error`` naming it)."""
        try:
            prepared = await asyncio.to_thread(self.service.prompt, text, **voice)
        except SpeechError as e:
            await self._send(wire.error_event(str(e), e.code, e.param, clause=cid))
            return
        samples, pieces = 0, self.service.stream(prepared)
        try:
            while True:
                try:
                    piece = await anext(pieces)
                except StopAsyncIteration:
                    break
                except SpeechError as e:  # refused once queued, before any audio
                    await self._send(wire.error_event(str(e), e.code, e.param, clause=cid))
                    return
                except Exception as e:  # a bug in the service: this clause fails, the socket goes on
                    log.exception("speech stream: clause %d failed", cid)
                    await self._send(wire.error_event(f"speech failed: {e}", "speech_failed", clause=cid))
                    return
                pcm = wire.pcm16(piece)
                samples += piece.shape[0]
                await self._send(pcm if self.fmt == "pcm" else wire.audio_event(cid, pcm))
        finally:
            await pieces.aclose()
        await self._send(wire.event("clause.done", clause=cid, samples=samples))


def add_route(r: APIRouter, host: ServerState) -> None:
    """Add ``WS /v1/audio/speech/stream`` over ``host``'s speech service to ``r``."""

    @r.websocket("/v1/audio/speech/stream")
    async def speech_stream(ws: WebSocket) -> None:
        """Stream text in, speech out (module docstring; ``?format=pcm|base64``)."""
        await ws.accept()
        fmt = ws.query_params.get("format", "pcm")
        refusal = None
        if fmt not in wire.FORMATS:
            refusal = (f"format {fmt!r}: use pcm or base64", "invalid_value", CLOSE_POLICY, "format")
        elif host.draining:
            msg = "the server is shutting down (draining): no new streams"
            refusal = (msg, "session_limit_reached", CLOSE_TRY_AGAIN_LATER, None)
        if refusal is None:
            try:  # ?model= picks a loaded speech model by name, as POST /v1/audio/speech's `model`
                service = await asyncio.to_thread(host.speech_service, ws.query_params.get("model"))
            except SpeechError as e:
                refusal = (str(e), e.code, CLOSE_POLICY, "model")
            except Exception as e:
                log.exception("speech service failed to load")
                refusal = (f"the speech service failed to load: {e}", "speech_service_failed", 1011, None)
        if refusal is not None:
            message, code, close, param = refusal
            with contextlib.suppress(Exception):
                await ws.send_text(wire.error_event(message, code, param))
                await ws.close(code=close, reason=close_reason(message))
            return
        await SpeechStream(ws, service, fmt).run()
