"""The function calls of one session's replies: which tools a reply is offered, the calls it makes (session
events and history entries), and, with a server-side :class:`~omniduplex.app.core.tools.ToolRunner`, running
them and what the reply's continuation is offered (:mod:`omniduplex.app.core.tools` has the two modes)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np

from omniduplex.app.core.events import FunctionCallOutput, SessionEvent, ToolCall
from omniduplex.app.core.history import FUNCTION_CALL, FUNCTION_CALL_OUTPUT, Entry, History
from omniduplex.app.core.replies import ReplyEvent, Responder
from omniduplex.app.core.reply import Reply
from omniduplex.app.core.session_config import SessionConfig
from omniduplex.app.core.tools import (
    MAX_CALLS_PER_TURN,
    CallArgumentsDelta,
    CallDone,
    CallEvent,
    CallFailed,
    CallStarted,
    ToolRunner,
    error_output,
)
from omniduplex.pipeline.stages.tool_calls import REPEAT_ERROR, call_key

log = logging.getLogger("omniduplex.session")


def _name(tool: dict[str, Any]) -> str:
    """A function tool's name (Realtime / Responses shape, or Chat Completions ``{"function": {...}}``)."""
    return str(tool.get("name") or (tool.get("function") or {}).get("name", ""))


class ToolCalls:
    """Function calls of one session. Call from the event loop thread.

    Args:
        name: the session id (events' ``session_id``).
        history: the session's history (calls and outputs join it).
        emit: receives the ``function_call_*`` events.
        cfg: the session's settings (``tools`` / ``tool_choice``, read live).
        runner: runs calls on the server (``None``: the client runs them).
        clock: monotonic seconds (call durations).
    """

    def __init__(
        self,
        name: str,
        history: History,
        emit: Callable[[SessionEvent], None],
        cfg: SessionConfig,
        runner: ToolRunner | None,
        clock: Callable[[], float],
    ) -> None:
        self.name, self.history, self.emit, self.cfg, self.runner, self.clock = (
            name, history, emit, cfg, runner, clock
        )

    def offer(self, override: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``tools`` / ``tool_choice`` options of a reply: the client's tools (``override``, a response's
        own when it has a ``tools`` key, else the session's ``cfg.tools``) and the runner's, whose names the
        client's do not take; ``{}`` when none. With a runner that has a filler (``filler_text``, and
        ``filler_after_s`` not 0) also ``call_filler`` / ``call_filler_tools``: the reply says the filler as
        it opens a call of a server-run tool (the LLM stage, :class:`~omniduplex.pipeline.text.reply_text.
        ReplyStream`), so the caller hears it within a second, not after the call is written and has run
        ``filler_after_s``; a client's own tools get none (its client speaks for them)."""
        if override is not None and "tools" in override:
            tools = list(override.get("tools") or [])
            choice = override.get("tool_choice", self.cfg.tool_choice)
        else:
            tools, choice = list(self.cfg.tools or []), self.cfg.tool_choice
        if self.runner is not None:
            taken = {_name(t) for t in tools}
            tools += [t for t in self.runner.tools if _name(t) not in taken]
        if not tools:
            return {}
        out: dict[str, Any] = {"tools": tools, "tool_choice": choice or "auto"}
        ours = [_name(t) for t in tools if self.runs_here(_name(t))]
        filler = getattr(self.runner, "filler_text", "")
        if filler and ours and getattr(self.runner, "filler_after_s", None):
            out.update(call_filler=filler, call_filler_tools=ours)
        return out

    def runs_here(self, name: str) -> bool:
        """Whether the session runs a call of ``name`` (one of its runner's tools) rather than its client."""
        return self.runner is not None and any(_name(t) == name for t in self.runner.tools)

    def on_event(self, r: Reply, ev: CallEvent) -> None:
        """One call event of reply ``r``: its session event; a finished call joins the history (and, with a
        runner, ``r.calls`` to be run)."""
        tid = r.turn_id
        if isinstance(ev, CallStarted | CallArgumentsDelta):
            r.filled |= isinstance(ev, CallStarted) and bool(ev.filler)  # said as the call opened
            self.emit(ToolCall(self.name, tid, ev))
        elif isinstance(ev, CallDone):
            key = call_key(ev.name, ev.arguments)
            if key in r.made:  # one call per need: a repeat is not made again (its output is in the history)
                log.info("%s: call %s repeats %s with the same arguments; not made", tid, ev.call_id, ev.name)
                r.repeated = True
                self.emit(ToolCall(self.name, tid, CallFailed(ev.call_id, ev.name, REPEAT_ERROR)))
                return
            r.made.add(key)
            self.history.add_tool(FUNCTION_CALL, ev.arguments, ev.call_id, ev.name)
            r.n_calls += 1
            run_here = self.runs_here(ev.name)
            if run_here:
                r.calls.append(ev.call)
            else:
                r.client_calls += 1
            self.emit(ToolCall(self.name, tid, ev, run_here))
        elif isinstance(ev, CallFailed):
            r.repeated |= ev.error == REPEAT_ERROR  # refused by the LLM stage: go on without a tool
            log.warning("%s: call %s of %s failed: %s", tid, ev.call_id, ev.name, ev.error)
            self.emit(ToolCall(self.name, tid, ev))

    async def run(self, r: Reply, speak: Callable[[str], Awaitable[Any]] | None = None) -> bool:
        """Run reply ``r``'s calls not run yet, in order, recording each output (a runner's exception
        becomes an ``{"error": ...}`` output, logged). An output is recorded even if the reply was
        interrupted meanwhile: the call was made.

        With ``speak`` (says words as written within the reply) and a runner that has them: a call still
        running after ``runner.filler_after_s`` gets ``runner.filler_text`` said once per reply, so the line
        is never silent; when every call failed, ``runner.apology_text`` is said and ``True`` returned (the
        reply ends with it: a small model would rather invent a result than explain an error)."""
        calls, r.calls = r.calls, []
        runner = self.runner
        if runner is None:
            return False
        filler_s = getattr(runner, "filler_after_s", None) if speak is not None else None
        failures = 0
        for call in calls:
            t0 = self.clock()
            task = asyncio.ensure_future(runner.run(call))
            if filler_s and speak is not None and not r.filled:
                done, _ = await asyncio.wait({task}, timeout=filler_s)
                if not done:
                    r.filled = True
                    await speak(getattr(runner, "filler_text", ""))
            try:
                output, failed = str(await task), False
            except Exception as e:  # a tool's failure is the model's to explain, never a crash
                log.warning("%s: tool %s failed: %s", r.turn_id, call.name, e)
                output, failed = error_output(e), True
            failures += failed
            self.history.add_tool(FUNCTION_CALL_OUTPUT, output, call.call_id)
            ms = 1000.0 * (self.clock() - t0)
            self.emit(FunctionCallOutput(self.name, r.turn_id, call.call_id, call.name, output, failed, ms))
        apology = getattr(runner, "apology_text", None) if speak is not None else None
        if apology and speak is not None and calls and failures == len(calls):
            await speak(apology)
            return True
        return False

    def say(self, r: Reply, text: str, responder: Responder) -> AsyncIterator[ReplyEvent]:
        """Start words said as written within reply ``r`` (pipeline request ``{turn_id}.{n}``, meta
        ``say``: the LLM stage passes them to the TTS stage ungenerated); their event stream (empty when the
        request could not start)."""
        r.segments += 1
        rid = r.request_id = f"{r.turn_id}.{r.segments}"
        try:
            options = {"say": text + " ", "user_text": ""}
            responder.start(rid, np.zeros(0, np.float32), self.history.snapshot(), options)
        except Exception:
            log.exception("%s: could not say %r", rid, text)
            return _nothing()
        return responder.events(rid)

    def continuation(self, r: Reply) -> dict[str, Any]:
        """The tool options of reply ``r``'s continuation after its calls ran: as it was offered, with no
        call allowed once the turn has made the runner's ``max_calls``, or after a call that repeated one
        already made (:data:`REPEAT_ERROR`: the model would only call again)."""
        opts: dict[str, Any] = {k: r.options[k] for k in ("tools", "tool_choice") if k in r.options}
        limit = getattr(self.runner, "max_calls", MAX_CALLS_PER_TURN)
        repeated, r.repeated = r.repeated, False
        if opts and (r.n_calls >= limit or repeated or opts.get("tool_choice") not in ("auto", "none")):
            opts["tool_choice"] = "none"  # the loop is cut; a forced choice or a repeat would only call again
        return opts

    def continue_reply(self, r: Reply, responder: Responder) -> AsyncIterator[ReplyEvent]:
        """Start reply ``r``'s continuation (pipeline request ``{turn_id}.{n}``) over the history with its
        calls' outputs, answering no new user text; its event stream. Raises what ``responder.start`` does."""
        r.segments += 1
        rid = r.request_id = f"{r.turn_id}.{r.segments}"
        skip = ("tools", "tool_choice", *(("call_filler", "call_filler_tools") if r.filled else ()))
        base = {k: v for k, v in r.options.items() if k not in skip}
        options = {**base, **self.continuation(r), "user_text": ""}
        responder.start(rid, np.zeros(0, np.float32), self.history.snapshot(), options)
        return responder.events(rid)

    def add_output(self, call_id: str, output: str) -> Entry:
        """Record the output of call ``call_id`` made by the client (a ``function_call_output``).

        Raises:
            KeyError: no call ``call_id`` is in the history.
        """
        if self.history.call(call_id) is None:
            raise KeyError(f"no function_call with call_id {call_id!r} in the conversation")
        return self.history.add_tool(FUNCTION_CALL_OUTPUT, output, call_id)


async def _nothing() -> AsyncIterator[ReplyEvent]:
    return
    yield  # an async generator with no events
