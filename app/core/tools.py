"""Function tools in a conversation: the calls a reply makes, their outputs, and who runs them.

A reply may be offered function tools (OpenAI function tools, ``{"type": "function", "name", "description",
"parameters"}``, and a ``tool_choice``: ``auto`` / ``none`` / ``required`` / ``{"type": "function", "name"}``;
:mod:`omniduplex.models.cascade.tool_prompt`). They travel to the LLM stage in the turn meta; the calls the
model writes come back as :data:`CallEvent` s (started, arguments delta, done or failed), are never spoken,
and each finished call joins the history as a ``function_call`` entry, its result as a
``function_call_output`` entry, which the next LLM turn renders (the family's tool format).

Who runs a call — one hook, two modes, chosen per session:

* **client-run** (no runner: the Realtime API, the LiveKit plugin): the session surfaces each call to its
  client as events and the reply ends; the client adds the output
  (:meth:`~omniduplex.app.core.session.Session.add_function_output`) and asks for a new reply.
* **server-run** (a :class:`ToolRunner` given to the session: browser, kiosk, phone): the session runs each
  call itself when the model has made it and continues the same reply with the results (a new pipeline
  request over the grown history, its audio queued after what was already said), until the model answers
  without calling or the runner's per-turn call limit is reached (then no tool is offered: the model must
  answer).

Barge-in cancels the reply and any continuation still to come; a call already made keeps its
``function_call`` entry, and a server-run call in progress still records its output when it returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

MAX_CALLS_PER_TURN = 4
"""Default most server-run calls per user turn (a :class:`ToolRunner` without ``max_calls``)."""


@dataclass(frozen=True)
class FunctionCall:
    """One call the model made: ``call_id`` (``call_`` + 24 hex digits, the OpenAI shape), the function's
    ``name`` and its ``arguments`` (a JSON object as a string; with grammar-constrained decoding it always
    parses and satisfies the tool's schema)."""

    call_id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> dict:
        """``arguments`` as a dict.

        Raises:
            ValueError: not a JSON object (an unconstrained model's malformed call).
        """
        args = json.loads(self.arguments)
        if not isinstance(args, dict):
            raise ValueError(f"arguments of {self.name} must be a JSON object, got {self.arguments!r}")
        return args


@runtime_checkable
class ToolRunner(Protocol):
    """Runs a session's function calls on the server (server-run mode, see the module docstring).

    One runner may serve every session of a server; it must be safe to call from several sessions at once
    (all on the event loop). Its contract:

    * ``tools``: the function tools offered to every reply of a session it serves (OpenAI function tool
      dicts, as :func:`~omniduplex.models.cascade.tool_prompt.tool_set` checks them); read at each reply.
    * ``max_calls``: most calls it runs per user turn; past it the reply continues with no tool offered.
    * ``run(call)``: the call's output, a string (JSON or plain text) the model reads as the result. An
      exception (or a timeout the runner applies itself) is not a crash: the session records the output
      ``{"error": "<message>"}`` and the model answers with it (an apology).
    """

    tools: list[dict]
    max_calls: int

    async def run(self, call: FunctionCall) -> str: ...


# -- what the responder streams (pipeline → conversation) ------------------------------------------------
@dataclass
class CallStarted:
    """The model started call ``index`` (0, 1, ... within the reply) of function ``name``."""

    call_id: str
    name: str
    index: int = 0


@dataclass
class CallArgumentsDelta:
    """More of call ``call_id``'s arguments text, as the model writes it."""

    call_id: str
    delta: str


@dataclass
class CallDone:
    """Call ``call_id`` is complete: its whole ``arguments`` (a JSON object as a string)."""

    call_id: str
    name: str
    arguments: str

    @property
    def call(self) -> FunctionCall:
        return FunctionCall(self.call_id, self.name, self.arguments)


@dataclass
class CallFailed:
    """Call ``call_id`` could not be read (cut off by the token budget, or malformed): ``error`` says why.
    It joins no history and is not run."""

    call_id: str
    name: str
    error: str


CallEvent = CallStarted | CallArgumentsDelta | CallDone | CallFailed


def error_output(error: BaseException | str) -> str:
    """The output recorded for a call whose runner failed: ``{"error": "<message>"}``."""
    return json.dumps({"error": str(error) or type(error).__name__}, ensure_ascii=False)
