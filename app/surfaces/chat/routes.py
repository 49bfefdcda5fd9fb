"""``POST /v1/chat/completions``: OpenAI-compatible chat over the cascade's LLM stage, so the engine that
speaks to callers also serves text agents (streamed as server-sent events or as one object, with
``tools`` / ``tool_choice`` and ``usage``).

A request is one text-only turn through the server's responder (the orchestrator: the LLM stage with its
grammar-constrained tool calls, no audio). It is authenticated like every ``/v1/`` route
(:mod:`omniduplex.app.host.auth`) and shares the server's capacity: it is refused with 503 while the
pipeline is not ready and 429 while ``max_sessions`` sessions and completions are in flight. A malformed
body → 400 with an OpenAI error object naming the field. A turn that fails in the pipeline is never answered
as a success: 500 (``code: pipeline_error``, the message naming the failing stage and the cause), or, once the
stream has started, an SSE ``error`` chunk in place of the finish chunk and ``[DONE]``. A duplex-only server
(``serve --model MOSHI_DIR``) has no text LLM: 404 ``not_a_chat_model`` (OpenAI's answer for a model that is
not a chat model) with :data:`~omniduplex.app.host.config.DUPLEX_ONLY`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from omniduplex.app.core.replies import ReplyDone, ReplyFailed, ReplyTextDelta
from omniduplex.app.core.tools import CallArgumentsDelta, CallDone, CallFailed, CallStarted
from omniduplex.app.host.admission import NotReady, SessionFull, check, new_call_id
from omniduplex.app.host.auth import Access
from omniduplex.app.host.config import DUPLEX_ONLY
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.chat.completions import (
    BadRequest,
    chunk,
    completion,
    finish_reason,
    parse_request,
    turn_of,
    usage,
)
from omniduplex.app.surfaces.wire.openai_rest import error_response

log = logging.getLogger("omniduplex.chat")


class _Turn:
    """One completion's events, folded into what the response needs."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[str, dict] = {}  # call_id → the Chat Completions tool call, in call order
        self.sent_args: dict[str, str] = {}
        self.metrics: dict = {}
        self.error: str | None = None  # the turn failed: what failed it (its stage named first)

    def deltas(self, ev) -> list[dict]:
        """The stream deltas of one reply event (and fold it in)."""
        if isinstance(ev, ReplyTextDelta) and ev.text:
            self.text.append(ev.text)
            return [{"content": ev.text}]
        if isinstance(ev, CallStarted):
            index = len(self.calls)
            fn = {"name": ev.name, "arguments": ""}
            self.calls[ev.call_id] = {"id": ev.call_id, "type": "function", "function": fn, "_i": index}
            self.sent_args[ev.call_id] = ""
            fn = dict(fn)
            return [{"tool_calls": [{"index": index, "id": ev.call_id, "type": "function", "function": fn}]}]
        if isinstance(ev, CallArgumentsDelta) and ev.call_id in self.calls:
            self.sent_args[ev.call_id] += ev.delta
            i = self.calls[ev.call_id]["_i"]
            return [{"tool_calls": [{"index": i, "function": {"arguments": ev.delta}}]}]
        if isinstance(ev, CallDone):
            if ev.call_id not in self.calls:
                self.deltas(CallStarted(ev.call_id, ev.name))
            call = self.calls[ev.call_id]
            call["function"]["arguments"] = ev.arguments
            sent = self.sent_args[ev.call_id]
            rest = ev.arguments[len(sent):] if ev.arguments.startswith(sent) else ""
            if rest:
                self.sent_args[ev.call_id] = ev.arguments
                return [{"tool_calls": [{"index": call["_i"], "function": {"arguments": rest}}]}]
            return []
        if isinstance(ev, CallFailed):
            log.warning("chat completion: call %s of %s could not be read: %s", ev.call_id, ev.name, ev.error)
            self.calls.pop(ev.call_id, None)
        elif isinstance(ev, ReplyDone):
            self.metrics = ev.metrics
        elif isinstance(ev, ReplyFailed):
            self.error = f"stage {ev.stage} failed: {ev.error}" if ev.stage else ev.error
        return []

    def tool_calls(self) -> list[dict]:
        return [{k: v for k, v in c.items() if k != "_i"} for c in self.calls.values()]


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


ACCESS = (Access("/v1/chat/"),)
"""What the edge asks of these routes: an API key or token."""


def router(host: ServerState) -> APIRouter:
    """``POST /v1/chat/completions`` over ``host``'s responder."""
    r = APIRouter(tags=["chat"])
    active: set[str] = set()

    async def events(rid: str) -> AsyncIterator:
        """The turn's events; a consumer that stops early cancels the turn and drains it (the
        responder's contract: the stream must be read to its end)."""
        stream = host.responder.events(rid)
        done = False
        try:
            async for ev in stream:
                done = isinstance(ev, (ReplyDone, ReplyFailed))
                yield ev
        finally:
            active.discard(rid)
            if not done:
                host.responder.cancel(rid)
                async def drain():
                    async for _ in stream:
                        pass
                with contextlib.suppress(asyncio.TimeoutError, RuntimeError, StopAsyncIteration):
                    await asyncio.wait_for(drain(), 10)

    @r.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        """A chat completion (see the module docstring)."""
        if host.cfg.duplex_only:  # no text LLM: OpenAI's answer to a model that is not a chat model
            return error_response(404, DUPLEX_ONLY, "not_a_chat_model", "model")
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            return error_response(400, f"the body is not JSON: {e}", "invalid_json")
        try:
            req = parse_request(body)
            history, options = turn_of(req)
        except BadRequest as e:
            return error_response(400, str(e), "invalid_value", e.param)
        try:
            check(host)
        except NotReady as e:
            return error_response(503, str(e), "not_ready")
        except SessionFull as e:
            return error_response(429, str(e), "server_full")
        if len(host.sessions) + len(active) >= host.cfg.max_sessions:
            return error_response(429, "server is full: every slot is in use", "server_full")
        rid = new_call_id("cc")
        try:
            host.responder.start(rid, np.zeros(0, np.float32), history, options)
        except ValueError as e:
            return error_response(400, str(e), "invalid_value")
        active.add(rid)
        cid, model, max_tokens = f"chatcmpl-{rid}", req.model, options["sampling"].get("max_tokens")
        turn = _Turn()
        if not req.stream:
            async for ev in events(rid):
                turn.deltas(ev)
            if turn.error is not None:
                return error_response(500, f"the turn failed: {turn.error}", "pipeline_error")
            reason = finish_reason(len(turn.calls), turn.metrics, max_tokens)
            return completion(cid, model, "".join(turn.text), turn.tool_calls(), reason, usage(turn.metrics))

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        async def sse():
            yield _sse(chunk(cid, model, {"role": "assistant", "content": ""}))
            async for ev in events(rid):
                for delta in turn.deltas(ev):
                    yield _sse(chunk(cid, model, delta))
            if turn.error is not None:
                message = f"the turn failed: {turn.error}"
                yield _sse({"error": {"message": message, "type": "server_error", "code": "pipeline_error"}})
                return
            reason = finish_reason(len(turn.calls), turn.metrics, max_tokens)
            yield _sse(chunk(cid, model, {}, reason))
            if include_usage:
                yield _sse(chunk(cid, model, None, use=usage(turn.metrics)))
            yield _sse("[DONE]")

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return r
