"""``POST /v1/chat/completions`` requests and responses: the OpenAI Chat Completions shapes (API reference;
``openai`` SDK ``types.chat``) mapped to one text-only turn of the cascade's LLM stage.

A request's ``messages`` become the turn: ``system`` / ``developer`` messages the system prompt (joined);
``user`` / ``assistant`` messages the history's ``[role, text]`` pairs; an assistant's ``tool_calls``
``function_call`` items and ``tool`` messages ``function_call_output`` items (the history shapes of
:mod:`omniduplex.models.cascade.tool_prompt`). A final ``user`` message is the turn's typed text; after a
final ``tool`` (or assistant) message the model answers the conversation as it stands.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from omniduplex.models.cascade.tool_prompt import tool_set


class BadRequest(ValueError):
    """A request the endpoint refuses with 400: ``param`` names the field (OpenAI's ``error.param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class _Function(BaseModel):
    name: str
    arguments: str


class _ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: _Function


class Message(BaseModel):
    """One chat message (``content``: a string, a list of ``{"type": "text", "text"}`` parts, or ``None``
    for an assistant message that only calls tools)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text (text parts joined; other part types are refused)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        out = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"content part of type {part.get('type')!r}: only text parts", "messages")
            out.append(part["text"])
        return "".join(out)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields served (others are accepted and ignored): ``messages``, ``tools``, ``tool_choice``,
    ``stream``, ``stream_options.include_usage``, ``max_completion_tokens`` / ``max_tokens``,
    ``temperature``, ``top_p``, ``seed``. ``n`` must be 1."""

    model_config = ConfigDict(extra="ignore")
    model: str = "omniduplex"
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = Field(None, ge=1, le=8192)
    max_tokens: int | None = Field(None, ge=1, le=8192)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    n: int = 1

    @field_validator("n")
    @classmethod
    def _one(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is served")
        return n


def parse_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body.

    Raises:
        BadRequest: not an object, a missing or malformed field (named), a bad tool or ``tool_choice``.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise BadRequest(f"{loc}: {err['msg']}", loc.split(".")[0] or None) from None
    if req.tools:
        try:
            tool_set(req.tools, req.tool_choice or "auto")
        except ValueError as e:
            raise BadRequest(str(e), "tools") from None
    elif req.tool_choice not in (None, "none", "auto"):
        raise BadRequest("tool_choice needs tools", "tool_choice")
    return req


def turn_of(req: ChatRequest) -> tuple[list, dict]:
    """``(history, options)`` of the turn for :meth:`~omniduplex.app.core.replies.Responder.start`.

    Raises:
        BadRequest: a ``tool`` message without ``tool_call_id``, or one that answers no earlier call.
    """
    system, history, calls = [], [], set()
    msgs = req.messages
    last_user = msgs[-1].role == "user"
    for i, m in enumerate(msgs[:-1] if last_user else msgs):
        if m.role in ("system", "developer"):
            system.append(m.text())
        elif m.role in ("user", "assistant"):
            text = m.text()
            if text or not m.tool_calls:
                history.append([m.role, text])
            for c in m.tool_calls or ():
                calls.add(c.id)
                history.append(
                    {"type": "function_call", "call_id": c.id, "name": c.function.name,
                     "arguments": c.function.arguments}
                )
        else:
            if m.tool_call_id not in calls:
                msg = f"messages[{i}].tool_call_id: no earlier tool call {m.tool_call_id!r}"
                raise BadRequest(msg, "messages")
            history.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": m.text()})
    options: dict[str, Any] = {"user_text": msgs[-1].text() if last_user else "", "spoken": False}
    if system:
        options["system_prompt"] = "\n\n".join(system)
    if req.tools and req.tool_choice != "none":
        options["tools"], options["tool_choice"] = req.tools, req.tool_choice or "auto"
    sampling = {
        "max_tokens": req.max_completion_tokens or req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
    }
    options["sampling"] = {k: v for k, v in sampling.items() if v is not None}
    return history, options


def usage(metrics: dict) -> dict:
    """The ``usage`` object from a turn's ``done`` metrics (token counts of the LLM stage)."""
    p, c = int(metrics.get("prompt_tokens", 0)), int(metrics.get("completion_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def finish_reason(n_calls: int, metrics: dict, max_tokens: int | None) -> str:
    """``tool_calls`` when the model called, ``length`` when it used its whole budget, else ``stop``."""
    if n_calls:
        return "tool_calls"
    if max_tokens and int(metrics.get("completion_tokens", 0)) >= max_tokens:
        return "length"
    return "stop"


def completion(cid: str, model: str, text: str, calls: list[dict], reason: str, use: dict) -> dict:
    """A ``chat.completion`` object (non-streaming)."""
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": use,
    }


def chunk(
    cid: str, model: str, delta: dict | None, reason: str | None = None, use: dict | None = None
) -> dict:
    """A ``chat.completion.chunk`` (``delta`` ``None``: the usage-only chunk with no choices)."""
    out: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time())}
    out["model"] = model
    out["choices"] = [] if delta is None else [
        {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
    ]
    if use is not None:
        out["usage"] = use
    return out
