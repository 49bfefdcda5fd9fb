"""Tool calls in a streamed reply: the model's call blocks parsed as they stream, and the events they become.

The LLM stage's reply text may hold call blocks in the Hermes / Qwen2.5 format
(:mod:`omniduplex.models.cascade.tool_prompt`), or the same object bare (without the tags)::

    Let me check that.
    <tool_call>
    {"name": "get_order_status", "arguments": {"order_id": "48213"}}
    </tool_call>

:class:`ToolCallParser` takes the reply's text deltas and separates the text said outside blocks (spoken,
as before) from the calls, which become events, in this order per call:

* :class:`~omniduplex.pipeline.events.CallStarted` (``call_id``, ``name``, ``index``) once the name is
  complete: ``call_id`` a new id (``call_`` + 24 hex digits, the OpenAI shape), ``index`` the call's position
  in the response (0, 1, ...);
* :class:`~omniduplex.pipeline.events.CallArgumentsDelta` (``call_id``, ``delta``): arguments text as the
  model writes it (the deltas of a call, joined, are its ``arguments``);
* :class:`~omniduplex.pipeline.events.CallDone` (``call_id``, ``name``, ``arguments``): the whole arguments,
  a JSON object as a string;
* or :class:`~omniduplex.pipeline.events.CallFailed` (``call_id``, ``name``, ``error``) instead of ``done``:
  a block cut off by the end of the reply (token budget) or, from an unconstrained model, one whose
  arguments are not a JSON object.

These objects are the call's one shape from here to the session: the LLM stage puts them in its
:class:`~omniduplex.pipeline.messages.DecoderOutput` (fields :data:`EVENT_KEYS`, at most one of each per
message, before the message's ``text``), the orchestrator passes them on as turn events. With
grammar-constrained decoding (:mod:`omniduplex.pipeline.engine.grammar`) every block is well formed and every
``arguments`` parses and satisfies its tool's schema by construction; without it (vLLM, an unconstrained
prompt), the parser still reads blocks written in the format loosely (any whitespace, ``arguments`` before
``name``), failing the
call rather than guessing.
"""

from __future__ import annotations

import json
import re
import secrets

from omniduplex.models.cascade.tool_prompt import BARE_PREFIX, CALL_CLOSE, CALL_OPEN, FENCE
from omniduplex.pipeline.events import CallArgumentsDelta, CallDone, CallFailed, CallStarted
from omniduplex.pipeline.text.json_scan import JsonValueEnd

STARTED = "call_started"
ARGUMENTS_DELTA = "call_delta"
DONE = "call_done"
FAILED = "call_failed"
EVENT_KEYS = (STARTED, ARGUMENTS_DELTA, DONE, FAILED)
"""The :class:`~omniduplex.pipeline.messages.DecoderOutput` fields of call events, in the order they come
within one message."""
REPEAT_ERROR = "the same call (same function, same arguments) was already made in this turn"
"""Why a repeated call fails: one call per need (the turn already has that call's output, or that function's
result: a call of it with other arguments is refused too, :class:`~..text.reply_text.ReplyStream`)."""


def call_key(name: str, arguments) -> tuple[str, str]:
    """What makes two calls the same: the function's name and its arguments (a JSON string or the parsed
    object) as canonical JSON (key order and spacing ignored; a string that does not parse compares as
    written)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return name, arguments
    return name, json.dumps(arguments, sort_keys=True, separators=(",", ":"))

_HEADER = re.compile(r'(?:json)?\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
FORMS = ((CALL_OPEN, False, CALL_CLOSE), (BARE_PREFIX, True, ""), (FENCE, False, FENCE))
"""How a call block opens, whether the opener is part of its JSON object, and what closes it after the object:
tagged (``<tool_call>`` … ``</tool_call>``), bare (``{"name": "`` … ``}``), fenced (a code fence)."""


def new_call_id() -> str:
    """A fresh call id: ``call_`` + 24 hex digits."""
    return "call_" + secrets.token_hex(12)


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker`` (it may still become
    the marker when more text arrives)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class _Arguments:
    """Finds the end of a JSON value streamed character by character (objects, arrays, strings; see
    :class:`~omniduplex.pipeline.text.json_scan.JsonValueEnd`), keeping its text from its first
    non-space character."""

    def __init__(self) -> None:
        self.text, self.started, self.scan = "", False, JsonValueEnd()

    def feed(self, s: str) -> int | None:
        """Add ``s``; the number of its characters up to the value's end, or ``None`` if it has not ended."""
        for i, c in enumerate(s):
            if not self.started:
                if c.isspace():
                    continue
                self.started = True
            self.text += c
            if self.scan.step(c):
                return i + 1
        return None


class ToolCallParser:
    """Reply text deltas → spoken text and call events (see the module docstring).

    :meth:`push` and :meth:`finish` return segments in order: ``("text", str)`` or ``(event_key, CallEvent)``.
    Text that may be the start of a call (any opener of :data:`FORMS`) is held until the next delta decides.

    Attributes:
        in_block: whether the text so far ends inside a call block (its tokens are not spoken text).
        calls: calls completed (``CallDone``) so far.
    """

    def __init__(self) -> None:
        self.buf = ""  # text not yet decided
        self.in_block = False
        self.calls = 0
        self.index = 0  # calls started
        self._reset_block()

    def _reset_block(self, form: tuple[str, bool, str] = FORMS[0]) -> None:
        self.form = form  # (opener, the opener is part of the object, closer after the object)
        self.block = ""  # raw text of the current block after its opener (a bare one's from its brace)
        self.call_id: str | None = None
        self.name: str | None = None
        self.args: _Arguments | None = None
        self.args_done = False
        self.brace_done = False

    def push(self, delta: str) -> list[tuple[str, object]]:
        """Add reply text; the segments it completes."""
        self.buf += delta
        out: list[tuple[str, object]] = []
        while self.buf:
            if not self.in_block:
                at_ = [(self.buf.find(opener), k) for k, (opener, _, _) in enumerate(FORMS)]
                found = [(i, k) for i, k in at_ if i >= 0]
                if not found:
                    keep = max(_held_prefix(self.buf, opener) for opener, _, _ in FORMS)
                    said, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
                    if said:
                        out.append(("text", said))
                    return out
                at, k = min(found)
                if at:
                    out.append(("text", self.buf[:at]))
                opener, kept, _ = FORMS[k]
                self.buf = self.buf[at if kept else at + len(opener) :]
                self.in_block = True
                self._reset_block(FORMS[k])
                continue
            if not self._block_step(out):
                return out
        return out

    def _block_step(self, out: list) -> bool:
        """Consume block text from ``buf``; ``False`` when more text is needed."""
        closer = self.form[2]
        if self.name is None:  # the header: {"name": "...", "arguments":
            self.block, self.buf = self.block + self.buf, ""
            m = _HEADER.match(self.block)
            if m is not None:
                self.name = json.loads(f'"{m.group(1)}"')
                self.call_id = new_call_id()
                out.append((STARTED, CallStarted(self.call_id, self.name, self.index)))
                self.index += 1
                self.buf, self.block, self.args = self.block[m.end() :], "", _Arguments()
                return True
            # not in the expected order: read the block whole at its end
            if closer:
                end = self.block.find(closer)
                if end < 0:
                    return False
                self.block, self.buf = self.block[:end], self.block[end + len(closer) :]
            else:
                n = _Arguments().feed(self.block)
                if n is None:
                    return False
                self.block, self.buf = self.block[:n], self.block[n:]
            self._whole_block(out)
            return True
        if not self.args_done:
            before = len(self.args.text)
            n = self.args.feed(self.buf)
            if len(self.args.text) > before:
                out.append((ARGUMENTS_DELTA, CallArgumentsDelta(self.call_id, self.args.text[before:])))
            if n is None:
                self.buf = ""
                return False
            self.buf = self.buf[n:]
            self.args_done = True
        if not self.brace_done:  # the object's own closing brace
            rest = self.buf.lstrip()
            if not rest:
                self.buf = ""
                return False
            self.buf, self.brace_done = rest[1:] if rest[0] == "}" else rest, True
        if closer:
            end = self.buf.find(closer)
            if end < 0:  # whitespace until the closing tag or fence
                keep = _held_prefix(self.buf, closer)
                self.buf = self.buf[len(self.buf) - keep :]
                return False
            self.buf = self.buf[end + len(closer) :]
        out.append(self._close())
        return True

    def _close(self) -> tuple[str, dict]:
        """The ``done`` (or ``failed``) event of the block whose arguments are complete."""
        text = self.args.text
        call_id, name = self.call_id, self.name
        self.in_block = False
        self._reset_block()
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
        if not ok:
            return FAILED, CallFailed(call_id, name, "arguments are not a JSON object")
        self.calls += 1
        return DONE, CallDone(call_id, name, text)

    def _whole_block(self, out: list) -> None:
        """A block whose header did not stream in the expected order: read it whole."""
        self.in_block = False
        raw, self.block = self.block, ""
        raw = re.sub(r"^[A-Za-z]*\s*", "", raw) if self.form[0] == FENCE else raw
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        call_id = new_call_id()
        name = obj.get("name") if isinstance(obj, dict) else None
        args = obj.get("arguments") if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        if not isinstance(name, str) or not isinstance(args, dict):
            out.append((FAILED, CallFailed(call_id, name or "", "not a tool call block")))
            return
        text = json.dumps(args, ensure_ascii=False)
        out.append((STARTED, CallStarted(call_id, name, self.index)))
        self.index += 1
        out.append((ARGUMENTS_DELTA, CallArgumentsDelta(call_id, text)))
        out.append((DONE, CallDone(call_id, name, text)))
        self.calls += 1

    def finish(self) -> list[tuple[str, object]]:
        """End of the reply: held text as text; a block still open fails (a ``CallFailed``)."""
        out: list[tuple[str, object]] = []
        if not self.in_block:
            if self.buf:
                out.append(("text", self.buf))
            self.buf = ""
            return out
        if self.name is None:
            self.block += self.buf
            self.buf = ""
            if self.block.strip():
                self._whole_block(out)  # an unconstrained model may leave out </tool_call>
            self.in_block = False
            return out
        if self.args_done:  # arguments complete, only the closing tag missing
            out.append(self._close())
            return out
        error = "the reply ended inside the call"
        out.append((FAILED, CallFailed(self.call_id, self.name, error)))
        self.in_block = False
        self._reset_block()
        self.buf = ""
        return out
