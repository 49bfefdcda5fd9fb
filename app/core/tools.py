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
from typing import Any, Protocol, runtime_checkable

from omniduplex.pipeline.events import (  # the calls a reply streams: the orchestrator's own events
    CallArgumentsDelta,
    CallDone,
    CallEvent,
    CallFailed,
    CallStarted,
    FunctionCall,
)

__all__ = [
    "MAX_CALLS_PER_TURN",
    "CallArgumentsDelta",
    "CallDone",
    "CallEvent",
    "CallFailed",
    "CallStarted",
    "FunctionCall",
    "ToolRunner",
    "error_output",
]

MAX_CALLS_PER_TURN = 4
"""Default most server-run calls per user turn (a :class:`ToolRunner` without ``max_calls``)."""



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

    tools: list[dict[str, Any]]
    max_calls: int

    async def run(self, call: FunctionCall) -> str: ...


# -- what the responder streams (pipeline → conversation) ------------------------------------------------


def error_output(error: BaseException | str) -> str:
    """The output recorded for a call whose runner failed: ``{"error": "<message>"}``."""
    return json.dumps({"error": str(error) or type(error).__name__}, ensure_ascii=False)
