"""One Realtime API connection: a WebSocket's client events drive a
:class:`~omniduplex.app.core.session.Session`, and the session's events become the GA server events (wire
shapes in :mod:`omniduplex.app.surfaces.wire.realtime`). No turn-taking lives here: VAD, end of turn,
barge-in and history are the session's. The connection is the loop and the dispatch; its items are
:mod:`.items`' store (the ``conversation.item.*`` handlers :mod:`.item_events`), its responses
:mod:`.responses`' lifecycle, its manual-commit audio the core's
:class:`~omniduplex.app.core.input_buffer.InputAudioBuffer`.

Mapping (client → session): ``input_audio_buffer.append`` → 20 ms frames at 16 kHz into
:meth:`Session.push_audio` (server VAD), or into the connection's buffer when ``turn_detection`` is null;
``input_audio_buffer.commit`` → :meth:`Session.commit_audio`; ``session.update`` → the session's turn
config and :meth:`Session.set_options`; ``conversation.item.create`` →
:meth:`Session.add_user_text` / :meth:`Session.commit_audio` (user audio) / the history (assistant text);
``response.create`` → :meth:`Session.respond` (``instructions`` add to the system prompt for that reply,
``metadata`` is echoed); ``response.cancel`` → :meth:`Session.cancel_reply`; ``conversation.item.truncate``
→ :meth:`Session.truncate`; ``conversation.item.delete`` → :meth:`Session.forget`.

Mapping (session → client): ``UserSpeechStarted`` → ``input_audio_buffer.speech_started``;
``UserTurnCommitted`` → ``speech_stopped`` + ``committed`` + ``conversation.item.added|done`` (the user
item); ``UserTranscriptPartial`` (its ``delta``, while the user speaks) →
``conversation.item.input_audio_transcription.delta``, on the item id ``speech_started`` announced (the
item itself is added at commit); ``UserTranscriptEvent`` →
``conversation.item.input_audio_transcription.completed``;
``ReplyStarted`` → ``response.created`` … ``response.content_part.added``; ``ReplyText`` →
``response.output_audio_transcript.delta`` (or ``output_text.delta``); reply audio →
``response.output_audio.delta``; ``ReplyEnded`` → the ``*.done`` events and ``response.done`` with
``completed``, ``cancelled`` (``turn_detected`` on barge-in, ``client_cancelled``) or ``failed`` (after an
``error`` event, ``code: pipeline_error``, naming what failed).

Audio goes through the connection's :class:`~omniduplex.app.core.audio.AudioPort`: appends are decoded and
handed to it (16 kHz session frames); reply audio leaves at real-time pace, one 20 ms frame per tick of its
clock: what was sent is what the client can have played, so a barge-in stops the deltas at once and the
history keeps what was heard; the client's ``conversation.item.truncate`` corrects it to what it really
played.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from fastapi import WebSocket, WebSocketDisconnect

from omniduplex.app.core.audio import AudioPort
from omniduplex.app.core.events import (
    BargeIn,
    ReplyEnded,
    ReplyStarted,
    ReplyText,
    SessionError,
    SessionEvent,
    ToolCall,
    UserSpeechStarted,
    UserTranscriptEvent,
    UserTranscriptPartial,
    UserTurnCommitted,
)
from omniduplex.app.core.events import FunctionCallOutput as CallOutputEvent
from omniduplex.app.core.input_buffer import InputAudioBuffer
from omniduplex.app.core.replies import Responder
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tools import CallStarted
from omniduplex.app.core.vad import SAMPLE_RATE
from omniduplex.app.host.tools.mcp_client import MCPHub
from omniduplex.app.surfaces.realtime.item_events import ItemEvents
from omniduplex.app.surfaces.realtime.items import ConversationItems, StoredItem
from omniduplex.app.surfaces.realtime.mcp import RealtimeMcp, split_tools
from omniduplex.app.surfaces.realtime.responses import OUTPUT_RATE, ResponseLifecycle
from omniduplex.app.surfaces.realtime.settings import session_options, turn_config
from omniduplex.app.surfaces.realtime.tools import check_tools, response_tools
from omniduplex.app.surfaces.wire.realtime import server_events as ev
from omniduplex.app.surfaces.wire.realtime.audio import (
    FORMAT_RATE,
    OutputConverter,
    decode_payload,
    format_type,
)
from omniduplex.app.surfaces.wire.realtime.client_events import (
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    apply_session_update,
)
from omniduplex.app.surfaces.wire.realtime.client_events import SessionConfig as RealtimeConfig
from omniduplex.app.surfaces.wire.realtime.protocol import ProtocolError, parse_client_event

log = logging.getLogger("omniduplex.realtime")


@dataclass
class RealtimeLimits:
    """Per-connection limits. ``max_append_bytes``: decoded audio of one ``input_audio_buffer.append``;
    ``max_buffer_s``: audio held for a manual commit (seconds)."""

    max_append_bytes: int = 1 << 20
    max_buffer_s: float = 60.0


class RealtimeConnection(ItemEvents):
    """Serve one ``/v1/realtime`` WebSocket until it closes.

    Args:
        ws: the accepted WebSocket.
        session_id: names the session (and its turn ids).
        responder: the shared pipeline responder.
        base: the server's session settings (turn thresholds; the output rate is set to 24 kHz).
        turn_model: returns the shared Smart Turn model (loaded on first use) for ``semantic_vad``.
        limits: size limits.
        mcp: the server's MCP connections, for ``type: "mcp"`` tools (``None``: refused).
    """

    def __init__(
        self,
        ws: WebSocket,
        session_id: str,
        responder: Responder,
        base: SessionConfig,
        turn_model: Callable[[], object],
        limits: RealtimeLimits | None = None,
        mcp: MCPHub | None = None,
    ) -> None:
        self.ws, self.turn_model, self.limits = ws, turn_model, limits or RealtimeLimits()
        self.outbox: asyncio.Queue[dict | None] = asyncio.Queue()
        self.cfg = RealtimeConfig(id=session_id)
        self.base_turn = base.turn
        # the client's own tool choice (serve --tool-choice is the voice surfaces')
        turn = turn_config(self.cfg, base.turn)
        scfg = replace(base, output_rate=OUTPUT_RATE, turn=turn, tool_choice=self.cfg.tool_choice)
        self.items = ConversationItems()
        self.mcp = RealtimeMcp(mcp, self._send, self.items)  # runs the session's MCP tools' calls
        self.session = Session(session_id, responder, self._on_event, scfg, tool_runner=self.mcp)
        self.port = AudioPort(self.session, self._input_rate)
        self.buffer = InputAudioBuffer(self.limits.max_buffer_s)  # audio since the last commit
        self.speech_item: str | None = None  # the user item the open speech segment will become
        self.responses = ResponseLifecycle(self._send, "conv_" + session_id, self.items, lambda: self.cfg)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Send ``session.created``, then serve until the client goes; the reply in flight is cancelled."""
        writer = asyncio.create_task(self._writer(), name=f"rt-writer-{self.session.id}")
        pacer = asyncio.create_task(self.port.run(self._pull), name=f"rt-pacer-{self.session.id}")
        self._send(ev.session_created(self.cfg))
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                raw = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
                if raw is not None:
                    self.handle(raw)
        except WebSocketDisconnect:
            pass
        finally:
            pacer.cancel()
            self.mcp.close()
            await self.session.close("client disconnected")
            self.outbox.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer, timeout=2.0)
            writer.cancel()

    async def _writer(self) -> None:
        while (item := await self.outbox.get()) is not None:
            try:
                await self.ws.send_text(item.model_dump_json())
            except Exception:  # the client is gone; run() notices on its next receive
                return

    def _send(self, event: ev.WireModel) -> None:
        if isinstance(event, ev.Error):  # every error a client gets is in the server's log too
            log.warning(
                "%s: error sent to the client: %s (%s)",
                self.session.id,
                event.error.message,
                event.error.code,
            )
        self.outbox.put_nowait(event)

    @property
    def _input_rate(self) -> int:
        """Sample rate of the client's input audio format (Hz)."""
        return FORMAT_RATE[format_type(self.cfg.audio.input.format)]

    def _pull(self, due: float) -> None:
        """One tick of the port's clock: one 20 ms frame of reply audio as one delta (the pull's events,
        held back by the session, follow it)."""
        self.port.pull(None, self.responses.audio)

    # -- client events ---------------------------------------------------------------------------------
    def handle(self, raw: str | bytes) -> None:
        """Apply one client event; a bad one is answered with an ``error`` event and changes nothing."""
        try:
            e = parse_client_event(raw)
            handler = self._handlers.get(type(e))
            if handler is None:
                raise ProtocolError("invalid_value", f"{e.type} is not supported", e.event_id)
            handler(self, e)
        except ProtocolError as err:
            self._send(err.to_event())

    def _session_update(self, e: SessionUpdate) -> None:
        cfg = apply_session_update(self.cfg, e.session)
        _, mcp = split_tools(cfg.tools)
        check_tools(cfg.tools, cfg.tool_choice, "session", e.event_id)
        servers = self.mcp.connections(mcp, "session", e.event_id)
        turn = turn_config(cfg, self.base_turn)
        self.session.set_turn_config(turn, self.turn_model() if turn.turn_detection == "smart" else None)
        self.session.set_options(**session_options(cfg))
        if cfg.audio.output.format != self.cfg.audio.output.format:
            self.responses.out = OutputConverter(cfg.audio.output.format)
        self.cfg = cfg
        self._send(ev.session_updated(cfg))
        if "tools" in e.session.model_fields_set:
            self.mcp.configure(servers)

    def _append(self, e: InputAudioBufferAppend) -> None:
        wire = decode_payload(e.audio, self.cfg.audio.input.format, e.event_id)
        pcm = self.port.resample(wire, self._input_rate)  # 16 kHz int16
        if pcm.size * 2 > self.limits.max_append_bytes:
            raise ProtocolError(
                "invalid_value",
                f"input_audio_buffer.append of {pcm.size / SAMPLE_RATE:.1f} s exceeds the limit of "
                f"{self.limits.max_append_bytes // 2 / SAMPLE_RATE:.1f} s per event",
                e.event_id,
                "audio",
            )
        vad = self.cfg.audio.input.turn_detection is not None
        if not vad and not self.buffer.fits(pcm.size):
            raise ProtocolError(
                "input_audio_buffer_too_large",
                f"the input audio buffer holds over {self.limits.max_buffer_s:.0f} s; commit or clear it",
                e.event_id,
            )
        self.buffer.append(pcm)  # server VAD: a long silence between turns drops the oldest audio
        if vad:
            self.port.feed(pcm)

    def _commit(self, e: InputAudioBufferCommit) -> None:
        held_ms = self.buffer.ms
        wav = self.buffer.take()
        if wav is None:
            raise ProtocolError(
                "input_audio_buffer_commit_empty",
                f"buffer too small: need 100 ms of audio or more, got {held_ms} ms",
                e.event_id,
            )
        self.session.commit_audio(wav, respond=False)

    def _clear(self, e: InputAudioBufferClear) -> None:
        self.buffer.clear()
        self._send(ev.input_audio_buffer_cleared())

    def _response_create(self, e: ResponseCreate) -> None:
        if self.responses.current is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"response {self.responses.current.response_id} is in progress; cancel it or wait for "
                "response.done",
                e.event_id,
            )
        p = e.response
        self.responses.next_modality = (
            p.output_modalities if p and p.output_modalities else self.cfg.output_modalities
        )[0]
        metadata = dict(p.metadata or {}) if p else {}
        tools = response_tools(p, self.cfg, e.event_id)
        if self.session.respond(p.instructions if p else None, metadata, tools) is None:
            raise ProtocolError("server_error", "the response could not start", e.event_id)

    def _response_cancel(self, e: ResponseCancel) -> None:
        r = self.responses.current
        if r is None or (e.response_id and e.response_id != r.response_id):
            raise ProtocolError("response_cancel_not_active", "no active response to cancel", e.event_id)
        r.cancel_reason = "client_cancelled"
        self.session.cancel_reply()

    def _output_clear(self, e: OutputAudioBufferClear) -> None:
        r = self.responses.current
        if r is not None:
            r.cancel_reason = "client_cancelled"
            self.session.cancel_reply()
            self._send(ev.output_audio_buffer_cleared(r.response_id))

    _handlers = {
        SessionUpdate: _session_update,
        InputAudioBufferAppend: _append,
        InputAudioBufferCommit: _commit,
        InputAudioBufferClear: _clear,
        ConversationItemCreate: ItemEvents._item_create,
        ConversationItemDelete: ItemEvents._item_delete,
        ConversationItemTruncate: ItemEvents._item_truncate,
        ConversationItemRetrieve: ItemEvents._item_retrieve,
        ResponseCreate: _response_create,
        ResponseCancel: _response_cancel,
        OutputAudioBufferClear: _output_clear,
    }

    # -- session events --------------------------------------------------------------------------------
    def _on_event(self, e: SessionEvent) -> None:
        vad = self.cfg.audio.input.turn_detection is not None
        if isinstance(e, UserSpeechStarted) and vad:
            self.speech_item = ev.new_id("item")
            self._send(ev.input_audio_buffer_speech_started(int(e.at_ms), self.speech_item))
        elif isinstance(e, UserTurnCommitted):
            item_id = self.speech_item or ev.new_id("item")
            self.speech_item = None
            if vad and e.speech_end_at_ms:
                self._send(ev.input_audio_buffer_speech_stopped(int(e.speech_end_at_ms), item_id))
                self.buffer.clear()
            prev = self.items.append(item_id, StoredItem(e.turn_id, "user"))
            self._send(ev.input_audio_buffer_committed(item_id, prev))
            item = ev.message_item(item_id, "user", [ev.input_audio(None)])
            self._send(ev.conversation_item_added(item, prev))
            self._send(ev.conversation_item_done(item, prev))
        elif isinstance(e, UserTranscriptPartial):
            item_id = self.items.of_turn(e.turn_id, "user") or self.speech_item
            if e.delta and item_id is not None and self.cfg.audio.input.transcription is not None:
                self._send(ev.conversation_item_input_audio_transcription_delta(item_id, e.delta))
        elif isinstance(e, UserTranscriptEvent):
            item_id = self.items.of_turn(e.turn_id, "user")
            if item_id is not None and self.cfg.audio.input.transcription is not None:
                self._send(ev.conversation_item_input_audio_transcription_completed(item_id, e.text))
        elif isinstance(e, ReplyStarted):
            self.responses.start(e)
        elif isinstance(e, ReplyText) and self.responses.of(e.turn_id) is not None:
            self.responses.text(e.text)
        elif isinstance(e, BargeIn) and self.responses.current is not None:
            self.buffer.clear()
        elif isinstance(e, ToolCall) and e.call is not None and self.responses.of(e.turn_id) is not None:
            c = e.call
            label = self.mcp.label.get(c.name, "") if isinstance(c, CallStarted) else ""
            self.responses.call(c, self.session.history.call(c.call_id), label)
        elif isinstance(e, CallOutputEvent) and self.responses.of(e.turn_id) is not None:
            self.responses.call_output(e)
        elif isinstance(e, ReplyEnded) and self.responses.of(e.turn_id) is not None:
            if e.reason == "error":  # then response.done with status failed, naming the same cause
                failed = f"the response failed: {e.error}"
                self._send(ev.error(failed, code="pipeline_error", type="server_error"))
            self.responses.finish(e)
        elif isinstance(e, SessionError):
            self._send(ev.error(e.message, code="server_error", type="server_error"))
