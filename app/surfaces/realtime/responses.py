"""The response lifecycle of one Realtime connection: a session reply (``ReplyStarted`` … ``ReplyEnded``) as
the API's ``response.*`` events, with its output items, transcript, audio and usage.

``response.created`` → for each output item ``response.output_item.added`` (+ ``conversation.item.added``)
and, for the assistant message (opened at its first text or audio), ``response.content_part.added`` →
deltas (``response.output_audio.delta`` paced by the connection's port,
``response.output_audio_transcript.delta`` or ``response.output_text.delta``) → ``*.done`` for the part
and the item → ``response.done`` with status ``completed``, ``cancelled`` (``turn_detected`` on a
barge-in, ``client_cancelled``) or ``failed``, and the output items in order. A function call the model
makes is a ``function_call`` item of the output: ``response.output_item.added``,
``response.function_call_arguments.delta`` as the model writes them, ``.done``, ``response.output_item.done``
(:mod:`~omniduplex.app.surfaces.wire.realtime.tool_events`); its text is never spoken. A call of a remote MCP
tool (:mod:`.mcp`) is an ``mcp_call`` item instead, closed when the server has run it. A response that
only calls has no message item; one with neither text nor calls has an empty message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from omniduplex.app.core.events import FunctionCallOutput, ReplyEnded, ReplyStarted
from omniduplex.app.core.history import FUNCTION_CALL, Entry
from omniduplex.app.core.tools import CallArgumentsDelta, CallDone, CallEvent, CallFailed, CallStarted
from omniduplex.app.surfaces.realtime.items import MESSAGE, ConversationItems, StoredItem
from omniduplex.app.surfaces.wire.realtime import server_events as ev
from omniduplex.app.surfaces.wire.realtime import server_objects as so
from omniduplex.app.surfaces.wire.realtime import tool_events as te
from omniduplex.app.surfaces.wire.realtime.audio import OutputConverter
from omniduplex.app.surfaces.wire.realtime.client_events import SessionConfig as RealtimeConfig

MCP_CALL = "mcp_call"
OUTPUT_RATE = 24_000
"""The session's output rate for realtime clients (Hz): ``audio/pcm`` is 24 kHz (GA reference)."""


@dataclass
class OutputItem:
    """One item of a response's output: its id, API item type and place in the output; a ``function_call``
    also its ``call_id``, ``name``, ``arguments`` and whether they are complete (``done``)."""

    id: str
    type: str = MESSAGE
    index: int = 0
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    done: bool = False
    label: str = ""  # an mcp_call's server_label
    output: str | None = None
    error: dict | None = None

    def call_item(self, status: str = "completed"):
        """The ``function_call`` (or ``mcp_call``) item as the API reports it."""
        if self.type == MCP_CALL:
            return so.McpCallItem(
                id=self.id, server_label=self.label, name=self.name, arguments=self.arguments,
                output=self.output, error=self.error,
            )
        return so.FunctionCallItem(
            id=self.id, status=status, call_id=self.call_id, name=self.name, arguments=self.arguments
        )


@dataclass
class Response:
    """The response in flight, mapped to the session's reply ``turn_id``."""

    response_id: str
    turn_id: str
    metadata: dict
    modality: str
    output: list[OutputItem]
    transcript: list[str] = field(default_factory=list)
    audio_ms: float = 0.0
    cancel_reason: str = "turn_detected"

    @property
    def message(self) -> OutputItem | None:
        """The response's assistant message (its audio and transcript), once opened."""
        return next((o for o in self.output if o.type == MESSAGE), None)

    def call(self, call_id: str) -> OutputItem | None:
        """The ``function_call`` / ``mcp_call`` output item of ``call_id``."""
        return next((o for o in self.output if o.type != MESSAGE and o.call_id == call_id), None)


class ResponseLifecycle:
    """The response in flight of one connection (at most one: the API's rule).

    Args:
        send: puts one server event on the connection's outbox.
        conversation_id: the ``conversation_id`` of every response object.
        items: the connection's item store (each output item joins the conversation).
        config: returns the connection's current session config (modalities, output format, voice).
    """

    def __init__(
        self,
        send: Callable[[ev.WireModel], None],
        conversation_id: str,
        items: ConversationItems,
        config: Callable[[], RealtimeConfig],
    ) -> None:
        self.send, self.conversation_id, self.items, self.config = send, conversation_id, items, config
        self.current: Response | None = None
        self.next_modality: str | None = None  # ``response.create``'s output modality for the next reply
        self.out = OutputConverter(config().audio.output.format)

    def of(self, turn_id: str) -> Response | None:
        """The response in flight when it answers reply ``turn_id``."""
        r = self.current
        return r if r is not None and r.turn_id == turn_id else None

    def start(self, e: ReplyStarted) -> Response:
        """The session started reply ``e``: ``response.created`` (its items open as they come)."""
        cfg = self.config()
        modality, self.next_modality = self.next_modality or cfg.output_modalities[0], None
        r = self.current = Response(ev.new_id("resp"), e.turn_id, e.metadata, modality, [])
        self.out = OutputConverter(cfg.audio.output.format)
        self.send(ev.response_created(self._object(r, cfg)))
        return r

    def _message(self, r: Response) -> OutputItem:
        """The response's assistant message, opened now (its ``added`` events) if it was not yet."""
        message = r.message
        if message is None:
            message = OutputItem(ev.new_id("item"), index=len(r.output))
            r.output.append(message)
            self.items.put(message.id, StoredItem(r.turn_id, "assistant"))
            item = ev.message_item(message.id, "assistant", [], "in_progress")
            self.send(ev.response_output_item_added(r.response_id, item, message.index))
            self.send(ev.conversation_item_added(item, self.items.append(message.id)))
            part = ev.audio_part() if r.modality == "audio" else ev.text_part()
            self.send(ev.response_content_part_added(r.response_id, message.id, part, message.index))
        return message

    def text(self, text: str) -> None:
        """A piece of the reply's transcript (or text, for a text response)."""
        r = self.current
        m = self._message(r)
        r.transcript.append(text)
        if r.modality == "audio":
            self.send(ev.response_output_audio_transcript_delta(r.response_id, m.id, text, m.index))
        else:
            self.send(ev.response_output_text_delta(r.response_id, m.id, text, m.index))

    def audio(self, pcm: np.ndarray, filled: int) -> None:
        """One frame pulled from the session (24 kHz int16; ``filled`` samples of reply audio) as a delta."""
        r = self.current
        if filled and r is not None and r.modality == "audio":
            m = self._message(r)
            data = self.out.push(pcm[:filled])
            r.audio_ms += 1000.0 * filled / OUTPUT_RATE
            if data:
                self.send(ev.response_output_audio_delta(r.response_id, m.id, data, m.index))

    # -- function calls ----------------------------------------------------------------------------
    def call(self, e: CallEvent, entry: Entry | None = None, label: str = "") -> None:
        """A call event of the response in flight (a :class:`~omniduplex.app.core.events.ToolCall`'s ``call``;
        ``entry``: a finished call's history entry; ``label``: the MCP server's, for a call the server runs
        itself)."""
        r = self.current
        if isinstance(e, CallStarted):
            kind = MCP_CALL if label else FUNCTION_CALL
            o = OutputItem(ev.new_id("item"), kind, len(r.output), e.call_id, e.name, label=label)
            r.output.append(o)
            self.items.put(o.id, StoredItem(r.turn_id, "assistant", kind))
            item = o.call_item("in_progress")
            self.send(ev.response_output_item_added(r.response_id, item, o.index))
            self.send(ev.conversation_item_added(item, self.items.append(o.id)))
            return
        o = r.call(e.call_id)
        if o is None or o.done:
            return
        if isinstance(e, CallArgumentsDelta):
            o.arguments += e.delta
            if o.type == MCP_CALL:
                self.send(te.ResponseMcpCallArgumentsDelta(response_id=r.response_id, item_id=o.id,
                                                           output_index=o.index, delta=e.delta))
            else:
                self.send(te.function_call_arguments_delta(r.response_id, o.id, o.index, o.call_id, e.delta))
            return
        if o.type == MCP_CALL and isinstance(e, CallDone):  # it runs now; closed by its output
            o.arguments = e.arguments
            self.items.put(o.id, StoredItem(None, "assistant", MCP_CALL, entry))
            self.send(te.ResponseMcpCallArgumentsDone(response_id=r.response_id, item_id=o.id,
                                                      output_index=o.index, arguments=o.arguments))
            self.send(te.ResponseMcpCallInProgress(item_id=o.id, output_index=o.index))
            return
        o.done = True
        if isinstance(e, CallFailed):  # never recorded: the item closes incomplete and is dropped
            self.items.pop(o.id)
            self.send(ev.response_output_item_done(r.response_id, o.call_item("incomplete"), o.index))
            return
        o.arguments = e.arguments
        self.items.put(o.id, StoredItem(None, "assistant", FUNCTION_CALL, entry))
        done = te.function_call_arguments_done(r.response_id, o.id, o.index, o.call_id, o.name, o.arguments)
        self.send(done)
        self.send(ev.response_output_item_done(r.response_id, o.call_item(), o.index))
        self.send(ev.conversation_item_done(o.call_item(), None))

    def call_output(self, e: FunctionCallOutput) -> None:
        """An MCP call of the response in flight was run: ``response.mcp_call.completed`` (or ``.failed``)
        and its item's closing events, with its output or error."""
        r = self.current
        o = r.call(e.call_id) if r is not None else None
        if o is None or o.type != MCP_CALL or o.done:
            return
        o.done = True
        if e.error:
            o.error = {"type": "tool_execution_error", "message": json.loads(e.output).get("error", e.output)}
            self.send(te.ResponseMcpCallFailed(item_id=o.id, output_index=o.index))
        else:
            o.output = e.output
            self.send(te.ResponseMcpCallCompleted(item_id=o.id, output_index=o.index))
        self.send(ev.response_output_item_done(r.response_id, o.call_item(), o.index))
        self.send(ev.conversation_item_done(o.call_item(), None))

    def finish(self, e: ReplyEnded) -> None:
        """The session ended the reply: the closing events of its output, then ``response.done``."""
        r, self.current = self.current, None
        cfg = self.config()
        if e.reason == "completed":
            status, details, text = "completed", None, e.text
        elif e.reason == "error":
            status, text = "failed", e.kept_text
            details = ev.status_details(
                "failed", error={"type": "server_error", "code": "pipeline_error", "message": e.error}
            )
        else:
            status, text = "cancelled", e.kept_text
            details = ev.status_details("cancelled", r.cancel_reason)
        if not r.output:  # nothing said and nothing called: an empty message, as before
            self._message(r)
        output = []
        for o in r.output:
            if o.type == MESSAGE:
                output.append(self._close_message(r, o, status, text))
            elif not o.done:  # cut off while the model wrote it (a barge-in, a cancel)
                o.done = True
                self.items.pop(o.id)
                output.append(o.call_item("incomplete"))
                self.send(ev.response_output_item_done(r.response_id, output[-1], o.index))
            else:
                output.append(o.call_item())
        usage = ev.usage_object(
            output_text_tokens=len(r.transcript) + sum(len(o.arguments) > 0 for o in r.output),
            output_audio_tokens=round(r.audio_ms / 50.0),
        )
        self.send(ev.response_done(self._object(r, cfg, status, details, output, usage)))

    def _close_message(self, r: Response, m: OutputItem, status: str, text: str):
        rid, iid, i = r.response_id, m.id, m.index
        if r.modality == "audio":
            tail = self.out.flush()
            if tail and status == "completed":
                self.send(ev.response_output_audio_delta(rid, iid, tail, i))
            self.send(ev.response_output_audio_done(rid, iid, i))
            self.send(ev.response_output_audio_transcript_done(rid, iid, text, i))
            part, content = ev.audio_part(text), [ev.output_audio(text)]
        else:
            self.send(ev.response_output_text_done(rid, iid, text, i))
            part, content = ev.text_part(text), [ev.output_text(text)]
        self.send(ev.response_content_part_done(rid, iid, part, i))
        done = "completed" if status == "completed" else "incomplete"
        item = ev.message_item(iid, "assistant", content, done)
        self.send(ev.response_output_item_done(rid, item, i))
        self.send(ev.conversation_item_done(item, None))
        return item

    def _object(self, r: Response, cfg: RealtimeConfig, status=None, details=None, output=None, usage=None):
        """The ``response`` object of ``response.created`` (no status) or ``response.done``."""
        extra = {"status": status, "status_details": details, "output": output, "usage": usage}
        return ev.response_object(
            r.response_id,
            conversation_id=self.conversation_id,
            output_modalities=[r.modality],
            metadata=r.metadata or None,
            voice=cfg.audio.output.voice,
            output_format=cfg.audio.output.format.model_dump(mode="json"),
            **{k: v for k, v in extra.items() if v is not None},
        )
