"""The response lifecycle of one Realtime connection: a session reply (``ReplyStarted`` … ``ReplyEnded``) as
the API's ``response.*`` events, with its output items, transcript, audio and usage.

``response.created`` → for each output item ``response.output_item.added`` (+ ``conversation.item.added``)
and ``response.content_part.added`` → deltas (``response.output_audio.delta`` paced by the connection's
port, ``response.output_audio_transcript.delta`` or ``response.output_text.delta``) → ``*.done`` for the
part and the item → ``response.done`` with status ``completed``, ``cancelled`` (``turn_detected`` on a
barge-in, ``client_cancelled``) or ``failed``. A response's output is a list of typed items (one assistant
message today); another item type (a ``function_call``) is one more entry of that list with its own events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from omniduplex.app.core.events import ReplyEnded, ReplyStarted
from omniduplex.app.surfaces.realtime.items import MESSAGE, ConversationItems, StoredItem
from omniduplex.app.surfaces.wire.realtime import server_events as ev
from omniduplex.app.surfaces.wire.realtime.audio import OutputConverter
from omniduplex.app.surfaces.wire.realtime.client_events import SessionConfig as RealtimeConfig

OUTPUT_RATE = 24_000
"""The session's output rate for realtime clients (Hz): ``audio/pcm`` is 24 kHz (GA reference)."""


@dataclass
class OutputItem:
    """One item of a response's output: its id and API item type."""

    id: str
    type: str = MESSAGE


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
    def item_id(self) -> str:
        """The id of the response's assistant message (its audio and transcript)."""
        return next(o.id for o in self.output if o.type == MESSAGE)


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
        """The session started reply ``e``: ``response.created`` and its message's opening events."""
        cfg = self.config()
        modality, self.next_modality = self.next_modality or cfg.output_modalities[0], None
        message = OutputItem(ev.new_id("item"))
        r = self.current = Response(ev.new_id("resp"), e.turn_id, e.metadata, modality, [message])
        self.items.put(message.id, StoredItem(e.turn_id, "assistant"))
        self.out = OutputConverter(cfg.audio.output.format)
        self.send(ev.response_created(self._object(r, cfg)))
        item = ev.message_item(message.id, "assistant", [], "in_progress")
        self.send(ev.response_output_item_added(r.response_id, item))
        self.send(ev.conversation_item_added(item, self.items.append(message.id)))
        part = ev.audio_part() if modality == "audio" else ev.text_part()
        self.send(ev.response_content_part_added(r.response_id, message.id, part))
        return r

    def text(self, text: str) -> None:
        """A piece of the reply's transcript (or text, for a text response)."""
        r = self.current
        r.transcript.append(text)
        if r.modality == "audio":
            self.send(ev.response_output_audio_transcript_delta(r.response_id, r.item_id, text))
        else:
            self.send(ev.response_output_text_delta(r.response_id, r.item_id, text))

    def audio(self, pcm: np.ndarray, filled: int) -> None:
        """One frame pulled from the session (24 kHz int16; ``filled`` samples of reply audio) as a delta."""
        r = self.current
        if filled and r is not None and r.modality == "audio":
            data = self.out.push(pcm[:filled])
            r.audio_ms += 1000.0 * filled / OUTPUT_RATE
            if data:
                self.send(ev.response_output_audio_delta(r.response_id, r.item_id, data))

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
        item = self._close_message(r, status, text)
        usage = ev.usage_object(
            output_text_tokens=len(r.transcript), output_audio_tokens=round(r.audio_ms / 50.0)
        )
        self.send(ev.response_done(self._object(r, cfg, status, details, [item], usage)))

    def _close_message(self, r: Response, status: str, text: str):
        rid, iid = r.response_id, r.item_id
        if r.modality == "audio":
            tail = self.out.flush()
            if tail and status == "completed":
                self.send(ev.response_output_audio_delta(rid, iid, tail))
            self.send(ev.response_output_audio_done(rid, iid))
            self.send(ev.response_output_audio_transcript_done(rid, iid, text))
            part, content = ev.audio_part(text), [ev.output_audio(text)]
        else:
            self.send(ev.response_output_text_done(rid, iid, text))
            part, content = ev.text_part(text), [ev.output_text(text)]
        self.send(ev.response_content_part_done(rid, iid, part))
        done = "completed" if status == "completed" else "incomplete"
        item = ev.message_item(iid, "assistant", content, done)
        self.send(ev.response_output_item_done(rid, item))
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
