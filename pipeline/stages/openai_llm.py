"""The cascade's LLM stage on any OpenAI-compatible server (``backend: openai``): vLLM, llama.cpp's server, a
hosted API — a large model as the brain while ASR and TTS stay local.

Same contract as :class:`~.llm.LLMWorker` (:mod:`.llm` for the messages in and out), with these differences:
the server tokenizes, so messages carry ``token`` int64 ``[0]`` and no ``prompt_ids``; one message per
streamed chunk. A turn becomes one streamed Chat Completions request (``POST {base_url}/chat/completions``
with ``stream: true``, through the official ``openai`` SDK): the system prompt, the history (``[role, text]``
pairs; ``function_call`` items as assistant ``tool_calls`` with their ``arguments`` string,
``function_call_output`` items as ``tool`` messages), the transcript; ``tools`` (Chat Completions shape) and
``tool_choice`` passed through after the same checks as on our engine; ``temperature``, ``top_p``, ``seed``
and ``max_tokens`` of the turn's sampling (other fields — ``top_k``, ``repetition_penalty``, stop ids — are
not part of the API and are not sent).

The reply goes through the same :class:`~.reply_stream.ReplyStream` as on our engine (the ear, the call
limit, the text budget); the server's streamed ``tool_calls`` deltas become the same ``tool_call_*`` events
(:mod:`.tool_calls`): ``started`` once a call's name is known (its ``call_id`` the server's id), each
``arguments`` fragment a delta, ``done`` when the next call starts or the stream ends — or ``failed`` when
the arguments are not a JSON object (a server that does not constrain its output). Call blocks the server
leaves in the text (no tool parser on its side) are parsed from the text as on our engine.

Failures are per turn, reported through :meth:`OpenAILLMWorker.pop_errors` (the stage fails that turn, the
others go on): a server that is down, answers an error (the status and its message), or stalls for more than
``timeout_s`` between chunks. No retries (a spoken turn cannot wait for them). ``abort`` cancels the turn's
task, which closes its HTTP stream (the server sees the client go and stops generating).

Threads: the SDK's ``AsyncOpenAI`` client runs on an asyncio loop in a daemon thread; :meth:`submit` and
:meth:`abort` post to it, chunks come back on a queue that :meth:`step` drains (waiting at most
:data:`STEP_WAIT_S` when nothing is ready).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import queue
import threading

import torch

from omniduplex.models.cascade.tool_prompt import ToolSet, calls_since_user, history_item, tool_set
from omniduplex.pipeline.config import StageConfig
from omniduplex.pipeline.engine.request import SamplingParams
from omniduplex.pipeline.events import CallArgumentsDelta, CallDone, CallFailed, CallStarted
from omniduplex.pipeline.messages import (
    DecoderOutput,
    PartialTranscript,
    StageMessage,
    Transcript,
    TurnOptions,
)
from omniduplex.pipeline.runtime.stage_engines import require_openai
from omniduplex.pipeline.stages.chat_prompt import CALL_TOKENS, handed_on, has_words
from omniduplex.pipeline.stages.contract import WorkerBase
from omniduplex.pipeline.stages.llm import compact_metas, drain
from omniduplex.pipeline.stages.tool_calls import ARGUMENTS_DELTA, DONE, FAILED, STARTED, new_call_id
from omniduplex.pipeline.text.reply_text import ReplyStream
from omniduplex.pipeline.text.spoken import sentence_budget

STEP_WAIT_S = 0.002
"""Longest :meth:`OpenAILLMWorker.step` waits for the next chunk when none is ready (s)."""
NO_KEY = "EMPTY"
"""The API key sent when the environment variable is not set (local servers such as vLLM accept any)."""


def chat_request(
    rid: str, opts: TurnOptions, transcript: str, model: str, max_tool_calls: int
) -> tuple[dict, dict, TurnOptions]:
    """``(create kwargs, ReplyStream kwargs, the turn's options to hand on)`` of a turn (see the module
    docstring).

    Raises:
        ValueError: a bad history entry, tool or ``tool_choice`` (the message names the field), or bad
            sampling parameters.
    """
    raw = dict(opts.sampling or {})
    try:
        sp = SamplingParams(**raw)
    except TypeError as e:
        raise ValueError(f"turn {rid}: bad sampling parameters ({e})") from e
    messages: list[dict] = []
    if opts.system_prompt is not None:
        messages.append({"role": "system", "content": opts.system_prompt})
    history = opts.history or []
    items = [history_item(i, h, f"turn {rid}: history") for i, h in enumerate(history)]
    for it in items:
        if it.get("type") == "function_call":
            call = {"id": it["call_id"], "type": "function"}
            call["function"] = {"name": it["name"], "arguments": it["arguments"]}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif it.get("type") == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
        else:
            messages.append(it)
    if transcript:
        messages.append({"role": "user", "content": transcript})
    try:
        tools = tool_set(opts.tools, opts.tool_choice)
    except ValueError as e:
        raise ValueError(f"turn {rid}: {e}") from None
    left = max_tool_calls - calls_since_user(items)
    if tools.active and left <= 0:
        tools = ToolSet(tools.tools, "none")
    kwargs: dict = {"model": model, "messages": messages, "temperature": sp.temperature, "top_p": sp.top_p}
    kwargs["max_tokens"] = sp.max_tokens + (CALL_TOKENS * left if tools.active else 0)
    if sp.seed is not None:
        kwargs["seed"] = sp.seed
    reply = {"speech": opts.spoken is not False, "calls": bool(tools.tools)}
    if reply["speech"] and not sp.ignore_eos:  # a few sentences unless the user asked for more
        asked = transcript or next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        reply["max_sentences"] = sentence_budget(asked if isinstance(asked, str) else "")
    if tools.tools:
        kwargs["tools"] = [t.signature() for t in tools.tools]
        choice = tools.choice
        kwargs["tool_choice"] = choice if choice in ("auto", "none", "required") else _named(choice)
        reply["max_calls"] = left if tools.active else 0
        reply["text_budget"] = sp.max_tokens if tools.active else None
    return kwargs, reply, handed_on(opts)


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


class _Calls:
    """A turn's streamed ``tool_calls`` deltas (by ``index``) → ``tool_call_*`` segments."""

    def __init__(self) -> None:
        self.open: dict[int, dict] = {}
        self.count = 0

    def delta(self, index: int, call_id: str | None, name: str | None, arguments: str | None) -> list:
        out = [] if index in self.open else self.close()
        fresh = {"call_id": call_id or new_call_id(), "name": "", "args": "", "sent": 0}
        call = self.open.setdefault(index, fresh)
        call["name"] += name or ""
        call["args"] += arguments or ""
        if not call.get("started") and call["name"]:
            call["started"] = True
            out.append((STARTED, CallStarted(call["call_id"], call["name"], self.count)))
            self.count += 1
        if call.get("started") and len(call["args"]) > call["sent"]:
            out.append((ARGUMENTS_DELTA, CallArgumentsDelta(call["call_id"], call["args"][call["sent"] :])))
            call["sent"] = len(call["args"])
        return out

    def close(self) -> list:
        """``done`` (or ``failed``) for every open call."""
        out = []
        for call in self.open.values():
            cid, name, args = call["call_id"], call["name"], call["args"]
            try:
                ok = isinstance(json.loads(args), dict)
            except ValueError:
                ok = False
            if not call.get("started"):
                out.append((STARTED, CallStarted(cid, name, self.count)))
                self.count += 1
            if ok:
                out.append((DONE, CallDone(cid, name, args)))
            else:
                error = "arguments are not a JSON object"
                out.append((FAILED, CallFailed(cid, name, error)))
        self.open.clear()
        return out


class _Turn:
    def __init__(self, reply: dict, turn: TurnOptions) -> None:
        self.reply = ReplyStream(**reply)
        self.turn: TurnOptions | None = turn  # None once the first message is out
        self.calls = _Calls()


class OpenAILLMWorker(WorkerBase):
    """The cascade LLM stage on an OpenAI-compatible server: ``submit`` / ``abort`` / ``step`` / ``has_work``
    as :class:`~.llm.LLMWorker`, plus ``pop_errors``, ``stats`` and ``close``.

    Args:
        cfg: the stage's settings (``backend: openai``: ``base_url``, ``model``, ``api_key_env``,
            ``timeout_s``; ``max_tool_calls``).

    Raises:
        OpenAIUnavailableError: the ``openai`` package is not installed.
    """

    def __init__(self, cfg: StageConfig) -> None:
        require_openai("llm")
        import httpx
        from openai import AsyncOpenAI

        self.base_url, self.model, self.max_tool_calls = cfg.base_url, cfg.model, cfg.max_tool_calls
        self.key_env = cfg.api_key_env
        timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 10.0))
        self.turns: dict[str, _Turn] = {}
        self.tasks: dict[str, concurrent.futures.Future] = {}
        self._ready: list[StageMessage] = []
        self._errors: list[tuple[str, str]] = []
        self._out: queue.SimpleQueue = queue.SimpleQueue()  # (request id, kind, payload)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-llm", daemon=True)
        self._thread.start()
        key = os.environ.get(cfg.api_key_env) or NO_KEY
        self.client = AsyncOpenAI(base_url=cfg.base_url, api_key=key, timeout=timeout, max_retries=0)

    # -- the asyncio side ----------------------------------------------------------------------------
    async def _generate(self, rid: str, kwargs: dict) -> None:
        import openai

        put = self._out.put
        server = f"the OpenAI-compatible server at {self.base_url}"
        try:
            stream = await self.client.chat.completions.create(**kwargs, stream=True)
            try:
                async for chunk in stream:
                    for choice in chunk.choices[:1]:
                        delta = choice.delta
                        if delta is not None and delta.content:
                            put((rid, "text", delta.content))
                        for tc in (delta.tool_calls or []) if delta is not None else []:
                            fn = tc.function
                            put((rid, "call", (tc.index, tc.id, fn and fn.name, fn and fn.arguments)))
                        if choice.finish_reason:
                            put((rid, "finish", choice.finish_reason))
            finally:
                await stream.close()  # on abort too: the server sees the client go
            put((rid, "finish", None))
        except asyncio.CancelledError:
            raise
        except openai.APITimeoutError:
            put((rid, "error", f"no answer within the timeout from {server}"))
        except openai.APIConnectionError as e:
            put((rid, "error", f"cannot reach {server} ({e.__cause__ or e})"))
        except openai.AuthenticationError as e:
            put((rid, "error", f"{self.base_url} refused the API key from ${self.key_env}: {_message(e)}"))
        except openai.APIStatusError as e:
            put((rid, "error", f"{self.base_url} answered {e.status_code}: {_message(e)}"))
        except Exception as e:  # a malformed stream
            put((rid, "error", f"{self.base_url}: {type(e).__name__}: {e}"))

    # -- the stage loop's side -------------------------------------------------------------------------
    def submit(self, msg: StageMessage) -> None:
        """Queue a turn (fields: :mod:`.llm`); its request starts at once.

        Raises:
            ValueError: bad input for this turn (as :meth:`.LLMWorker.submit`) or a duplicate id.
        """
        rid = msg.request_id
        if isinstance(msg.meta, PartialTranscript):
            return  # no prefill hints: the server has its own prefix cache, or none
        if not isinstance(msg.meta, Transcript):
            raise ValueError(f"turn {rid}: the LLM stage takes a Transcript, got {type(msg.meta).__name__}")
        if rid in self.turns or any(m.request_id == rid for m in self._ready):
            raise ValueError(f"turn {rid}: already running")
        opts = msg.meta.options
        kwargs, reply, turn = chat_request(rid, opts, msg.meta.transcript, self.model, self.max_tool_calls)
        empty = torch.zeros(0, dtype=torch.int64)
        if opts.say is not None:  # said as written (:mod:`.llm`)
            said = DecoderOutput(turn=turn, text=opts.say)
            self._ready.append(StageMessage(rid, {"token": empty}, said, last=True))
            return
        if opts.user_text is None and not has_words(msg.meta.transcript):
            meta = DecoderOutput(turn=turn, text="", skipped="empty transcript")
            self._ready.append(StageMessage(rid, {"token": empty}, meta, last=True))
            return
        self.turns[rid] = _Turn(reply, turn)
        self.tasks[rid] = asyncio.run_coroutine_threadsafe(self._generate(rid, kwargs), self._loop)

    def abort(self, request_id: str) -> None:
        """Drop a turn; its HTTP stream is closed. No-op when unknown."""
        self._ready = [m for m in self._ready if m.request_id != request_id]
        self._errors = [e for e in self._errors if e[0] != request_id]
        self.turns.pop(request_id, None)
        task = self.tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    def has_work(self) -> bool:
        return bool(self._ready or self.turns)

    def step(self) -> list[StageMessage]:
        """The messages of every chunk streamed since the last call, in order per turn (plus skipped turns'
        single message); waits up to :data:`STEP_WAIT_S` when nothing is ready."""
        outs, self._ready = self._ready, []
        items = drain(self._out, STEP_WAIT_S if self.turns and not outs else 0.0)
        for rid, kind, payload in items:
            t = self.turns.get(rid)
            if t is None:  # aborted or ended meanwhile
                continue
            if kind == "error":
                self.abort(rid)
                self._errors.append((rid, payload))
                continue
            if kind == "text":
                metas = t.reply.push(payload)
            elif kind == "call":
                metas = t.reply.push_segments(t.calls.delta(*payload))
            else:
                metas = t.reply.push_segments(t.calls.close())
            finish = None
            if kind == "finish" or t.reply.stop:  # the server's reason, or the end of its stream
                reason = payload if kind == "finish" and payload != "tool_calls" else None
                tail, finish = t.reply.finish(reason)
                metas += tail
                self.turns.pop(rid)
                task = self.tasks.pop(rid, None)
                if task is not None and t.reply.stop:
                    task.cancel()  # the reply ended itself (text budget, call limit): close the stream
            outs += self._messages(rid, t, compact_metas(metas), finish)
        return outs

    @staticmethod
    def _messages(rid: str, t: _Turn, metas: list[dict], finish: str | None) -> list[StageMessage]:
        out = []
        for i, meta in enumerate(metas):
            turn, t.turn = t.turn, None  # the turn's options go with its first message
            last = finish is not None and i == len(metas) - 1
            if last:
                meta["finish_reason"] = finish
                if t.reply.unspoken:
                    meta["unspoken"] = t.reply.unspoken
            empty = torch.zeros(0, dtype=torch.int64)
            out.append(StageMessage(rid, {"token": empty}, DecoderOutput(turn=turn, **meta), last=last))
        return out

    def pop_errors(self) -> list[tuple[str, str]]:
        """Turns that failed since the last call, as ``(request_id, error)``; the stage fails each one."""
        errors, self._errors = self._errors, []
        return errors

    def stats(self) -> dict[str, int]:
        """Gauges as :func:`..stage_stats.worker_stats` reports them: the turns streaming now."""
        return {"queue_depth": 0, "batch_size": len(self.turns)}

    def close(self) -> None:
        """Cancel every turn and close the client."""
        if not self._thread.is_alive():
            return
        for rid in list(self.turns):
            self.abort(rid)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def _message(e) -> str:
    """The error message of an API error's body (``{"error": {"message"}}`` or ``{"message"}``), else its
    text."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(e)
