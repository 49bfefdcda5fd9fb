"""The remote plugin's session (:mod:`.remote`): one room conversation on one ``/v1/realtime`` connection to
an omniduplex server, the framework's calls turned into typed client events and the server's events into the
framework's (the mapping and the barge-in contract: :mod:`.remote`'s docstring)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
from typing import Literal

import numpy as np
from livekit import rtc
from livekit.agents import APIConnectionError, llm
from livekit.agents.types import NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given

from omniduplex.app.core.audio import StreamResampler, to_int16
from omniduplex.app.core.audio.pcm import mono
from omniduplex.app.surfaces.livekit.audio import frame_pcm, pcm_frame
from omniduplex.app.surfaces.livekit.generation import (
    Generation,
    ReplyAsk,
    ReplyFuture,
    ReplySession,
    model_error,
)
from omniduplex.app.surfaces.livekit.remote_items import RemoteConversation
from omniduplex.app.surfaces.livekit.remote_link import RealtimeLink
from omniduplex.app.surfaces.wire.realtime import server_events as se
from omniduplex.app.surfaces.wire.realtime.client_events import (
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
)

log = logging.getLogger("omniduplex.livekit")

RATE = 24_000
"""``audio/pcm`` rate both ways (Hz)."""


class RemoteRealtimeSession(ReplySession):
    """One room conversation on one ``/v1/realtime`` connection, made by a
    :class:`~.remote.RemoteRealtimeModel` (``model``: its ``options`` say where and how to connect)."""

    def __init__(self, model: llm.RealtimeModel) -> None:
        super().__init__(model)
        self.opts = model.options
        self._instructions: str | None = None
        self.conversation = RemoteConversation()  # the server's, as last reported
        self._gen: Generation | None = None  # the response in flight
        self._gen_done = asyncio.Event()
        self._gen_done.set()
        self._after_response: list[ConversationItemTruncate] = []  # to send when the response in flight ends
        self._pending: dict[str, asyncio.Future[llm.GenerationCreatedEvent]] = {}  # client event id → future
        self._abandoned: set[str] = set()  # generate_reply requests cancelled or timed out before created
        self._resampler = StreamResampler(RATE, RATE)  # room rate → 24 kHz, restarted when the rate changes
        self._speaking = False  # speech_started reported, speech_stopped not yet
        self._server_cancels = False  # the server is cancelling the response in flight (turn detected)
        self._outage = False
        self._was_connected = False
        self._tasks: set[asyncio.Task] = set()
        self.link = RealtimeLink(
            self.opts.url, self.opts.api_key, self.opts.retry,
            self._on_event, self._on_connected, self._on_down, self._on_give_up,
        )  # fmt: skip
        self.link.start()

    # -- the framework's view -------------------------------------------------------------------------
    @property
    def chat_ctx(self) -> llm.ChatContext:
        """The server's conversation as last reported (and as this session changed it)."""
        return self.conversation.chat_ctx()

    @property
    def tools(self) -> llm.ToolContext:
        return llm.ToolContext.empty()

    # -- framework → server ---------------------------------------------------------------------------
    def push_audio(self, frame: rtc.AudioFrame) -> None:
        """User audio, resampled to 24 kHz PCM16 and appended to the server's input buffer (dropped while
        the server is unreachable)."""
        if not self.link.connected:
            return
        pcm, rate, channels = frame_pcm(frame)
        x = to_int16(self._resampler.process(mono(pcm, channels), rate))
        if x.size:
            data = base64.b64encode(x.astype("<i2").tobytes()).decode("ascii")
            self.link.send(InputAudioBufferAppend(type="input_audio_buffer.append", audio=data))

    def _unavailable(self) -> str | None:
        if self.link.connected:
            return None
        return f"omniduplex server {self.opts.url} unavailable (reconnecting)"

    def _start_reply(self, fut: ReplyFuture, ask: ReplyAsk) -> None:
        """``response.create`` (after cancelling a response in flight and waiting for its end); ``fut``
        resolves at the matching ``response.created`` and fails with ``RealtimeError`` on a server error,
        a lost connection, or after ``response_timeout_s`` (``ask.tools`` / ``tool_choice``: the server's)."""
        eid = f"event_{secrets.token_hex(8)}"
        self._pending[eid] = fut
        task = asyncio.get_running_loop().create_task(self._create_response(eid, ask.instructions))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create_response(self, eid: str, instructions: str | None) -> None:
        fut = self._pending.get(eid)
        if fut is None:
            return
        fut.add_done_callback(lambda f: f.cancelled() and self._abandon(eid))  # the framework gave up on it
        try:
            if self._gen is not None:  # the API allows one response at a time
                self.interrupt()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._gen_done.wait(), 2.0)
            if fut.done():
                return
            response: dict = {"metadata": {"client_event_id": eid}}
            if instructions:
                response["instructions"] = instructions
            if not self.link.send(ResponseCreate(type="response.create", event_id=eid, response=response)):
                raise llm.RealtimeError("omniduplex server connection lost")
            await asyncio.wait_for(asyncio.shield(fut), self.opts.response_timeout_s)
        except asyncio.TimeoutError:
            self._fail(eid, llm.RealtimeError("generate_reply timed out"))
            self._abandon(eid)
        except llm.RealtimeError as e:
            self._fail(eid, e)

    def _abandon(self, eid: str) -> None:
        """Nobody waits for request ``eid`` any more: if its response still comes, it is cancelled unheard."""
        self._pending.pop(eid, None)
        self._abandoned.add(eid)

    def interrupt(self) -> None:
        """``response.cancel`` for the response in flight; does nothing if there is none, or if the server is
        cancelling it already (the user's speech started during it: see the module docstring)."""
        if self._gen is not None and not self._server_cancels:
            self.link.send(ResponseCancel(type="response.cancel"))

    def truncate(
        self,
        *,
        message_id: str,
        modalities: list[Literal["text", "audio"]],
        audio_end_ms: int,
        audio_transcript: NotGivenOr[str] = NOT_GIVEN,
    ) -> None:
        """``conversation.item.truncate``: the room played ``audio_end_ms`` ms of ``message_id``; the server
        keeps the words of that audio in its history. Sent once the server has ended that response (it
        can only truncate a finished reply)."""
        event = ConversationItemTruncate(
            type="conversation.item.truncate",
            item_id=message_id,
            content_index=0,
            audio_end_ms=max(0, int(audio_end_ms)),
        )
        if self._gen is not None and message_id in self._gen.by_id:
            self._after_response.append(event)
        else:
            self.link.send(event)
        if is_given(audio_transcript):
            self.conversation.set_text(message_id, audio_transcript)

    async def update_instructions(self, instructions: str) -> None:
        """The session's instructions (system prompt) from the next reply on; re-sent after a reconnection."""
        self._instructions = instructions
        self.link.send(
            SessionUpdate(type="session.update", session={"type": "realtime", "instructions": instructions})
        )

    async def update_chat_ctx(self, chat_ctx: llm.ChatContext) -> None:
        """Make the server's conversation ``chat_ctx``'s user/assistant text messages: items missing from it
        are deleted, new or changed ones created (the server appends created items at the end)."""
        for event in self.conversation.update(chat_ctx):
            self.link.send(event)

    async def update_tools(self, tools: list[llm.Tool]) -> None:
        """Not supported (no function calling): ignored."""

    def update_options(self, *, tool_choice: NotGivenOr[llm.ToolChoice | None] = NOT_GIVEN) -> None:
        """Nothing to set."""

    def commit_audio(self) -> None:
        """``input_audio_buffer.commit``: the audio since the last turn becomes a turn now."""
        self.link.send(InputAudioBufferCommit(type="input_audio_buffer.commit"))

    def clear_audio(self) -> None:
        """``input_audio_buffer.clear``."""
        self.link.send(InputAudioBufferClear(type="input_audio_buffer.clear"))

    async def aclose(self) -> None:
        """Close the connection (the server cancels the reply in flight) and end every stream."""
        await self.link.aclose()
        for t in list(self._tasks):
            t.cancel()
        self._end_inflight(llm.RealtimeError("the realtime session is closed"))

    # -- connection -----------------------------------------------------------------------------------
    async def _on_connected(self, created: se.SessionCreated) -> None:
        session: dict = {
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": RATE},
                    "turn_detection": self.opts.turn_detection,
                    "transcription": {"model": "omniduplex"},
                },
                "output": {"format": {"type": "audio/pcm", "rate": RATE}},
            },
        }
        if self._instructions is not None:
            session["instructions"] = self._instructions
        self.link.send(SessionUpdate(type="session.update", session=session))
        for event in self.conversation.replay():  # a restarted server has forgotten the conversation
            self.link.send(event)
        if self._was_connected:
            log.info("realtime session reconnected to %s", self.opts.url)
            self.emit("session_reconnected", llm.RealtimeSessionReconnectedEvent())
        self._was_connected, self._outage = True, False

    def _on_down(self, err: Exception) -> None:
        self._end_inflight(llm.RealtimeError(f"omniduplex server connection lost: {err}"))
        if not self._outage:
            self._outage = True
            error = APIConnectionError(f"omniduplex realtime server {self.opts.url} unreachable: {err}")
            self.emit("error", model_error(self.realtime_model.label, error, recoverable=True))

    def _on_give_up(self, err: Exception) -> None:
        give_up = self.opts.retry.give_up_after_s
        error = APIConnectionError(
            f"omniduplex realtime server {self.opts.url} down for {give_up:.0f} s: {err}"
        )
        self.emit("error", model_error(self.realtime_model.label, error, recoverable=False))

    def _end_inflight(self, err: llm.RealtimeError) -> None:
        self._after_response.clear()
        for eid in list(self._pending):
            self._fail(eid, err)
        self._close_generation()
        if self._speaking:
            self._speaking = False
            self.emit("input_speech_stopped", llm.InputSpeechStoppedEvent(user_transcription_enabled=False))

    def _fail(self, eid: str, err: Exception) -> None:
        fut = self._pending.pop(eid, None)
        if fut is not None and not fut.done():
            fut.set_exception(err)

    def _close_generation(self) -> None:
        if self._gen is not None:
            self._gen.close()
            self._gen = None
        self._server_cancels = False
        self._gen_done.set()

    # -- server → framework ---------------------------------------------------------------------------
    def _on_event(self, ev: se.ServerEvent) -> None:
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev)

    def _speech_started(self, ev: se.InputAudioBufferSpeechStarted) -> None:
        self._speaking = True
        if self._gen is not None and _interrupts_responses(self.opts.turn_detection):
            self._server_cancels = True
        self.emit("input_speech_started", llm.InputSpeechStartedEvent())

    def _speech_stopped(self, ev: se.InputAudioBufferSpeechStopped) -> None:
        self._speaking = False
        enabled = self.realtime_model.capabilities.user_transcription
        self.emit("input_speech_stopped", llm.InputSpeechStoppedEvent(user_transcription_enabled=enabled))

    def _item_added(self, ev: se.ConversationItemAdded | se.ConversationItemDone) -> None:
        self.conversation.on_item(ev.item)

    def _item_deleted(self, ev: se.ConversationItemDeleted) -> None:
        self.conversation.on_deleted(ev.item_id)

    def _transcription(self, ev: se.ConversationItemInputAudioTranscriptionCompleted) -> None:
        self.conversation.set_text(ev.item_id, ev.transcript)
        if ev.transcript:
            self.emit(
                "input_audio_transcription_completed",
                llm.InputTranscriptionCompleted(item_id=ev.item_id, transcript=ev.transcript, is_final=True),
            )

    def _response_created(self, ev: se.ResponseCreated) -> None:
        self._close_generation()
        self._gen = Generation(ev.response.id)
        self._gen_done.clear()
        eid = (ev.response.metadata or {}).get("client_event_id")
        if eid in self._abandoned:
            self._abandoned.discard(eid)
            self.link.send(ResponseCancel(type="response.cancel"))
            return
        fut = self._pending.pop(eid, None) if eid else None
        created = self._gen.created_event(user_initiated=fut is not None)
        if fut is not None and not fut.done():
            fut.set_result(created)
        self.emit("generation_created", created)

    def _output_item_added(self, ev: se.ResponseOutputItemAdded) -> None:
        if self._gen is not None:
            self._gen.open_message(ev.item.id)

    def _content_part_added(self, ev: se.ResponseContentPartAdded) -> None:
        msg = self._message(ev.item_id)
        if msg is not None:
            msg.set_modalities(["audio", "text"] if ev.part.type == "audio" else ["text"])

    def _audio_delta(self, ev: se.ResponseOutputAudioDelta) -> None:
        msg = self._message(ev.item_id)
        if msg is not None:
            pcm = np.frombuffer(base64.b64decode(ev.delta), "<i2")
            if pcm.size:
                msg.push_audio(pcm_frame(pcm, RATE))

    def _text_delta(self, ev: se.ResponseOutputAudioTranscriptDelta | se.ResponseOutputTextDelta) -> None:
        msg = self._message(ev.item_id)
        if msg is not None:
            msg.push_text(ev.delta)

    def _response_done(self, ev: se.ResponseDone) -> None:
        self._close_generation()
        for event in self._after_response:
            self.link.send(event)
        self._after_response.clear()
        details = ev.response.status_details
        if ev.response.status == "failed":
            message = details.error.message if details and details.error else None
            err = llm.RealtimeError(f"response failed: {message or 'server error'}")
            self.emit("error", model_error(self.realtime_model.label, err, recoverable=True))

    def _error(self, ev: se.Error) -> None:
        err = ev.error
        if err.event_id in self._pending:
            self._fail(err.event_id, llm.RealtimeError(err.message, code=err.code))
        elif err.type == "server_error":
            error = llm.RealtimeError(err.message, code=err.code)
            self.emit("error", model_error(self.realtime_model.label, error, recoverable=True))
        else:
            log.warning("realtime server rejected an event: %s (%s)", err.message, err.code)

    def _message(self, item_id: str):
        return self._gen.by_id.get(item_id) if self._gen is not None else None


def _interrupts_responses(turn_detection: dict | None) -> bool:
    """Whether the server cancels a response in flight when the user starts speaking (the API's
    ``interrupt_response``, on by default for ``server_vad`` and ``semantic_vad``)."""
    return bool(turn_detection) and turn_detection.get("interrupt_response", True) is not False


_HANDLERS = {
    se.InputAudioBufferSpeechStarted: RemoteRealtimeSession._speech_started,
    se.InputAudioBufferSpeechStopped: RemoteRealtimeSession._speech_stopped,
    se.ConversationItemAdded: RemoteRealtimeSession._item_added,
    se.ConversationItemDone: RemoteRealtimeSession._item_added,
    se.ConversationItemDeleted: RemoteRealtimeSession._item_deleted,
    se.ConversationItemInputAudioTranscriptionCompleted: RemoteRealtimeSession._transcription,
    se.ResponseCreated: RemoteRealtimeSession._response_created,
    se.ResponseOutputItemAdded: RemoteRealtimeSession._output_item_added,
    se.ResponseContentPartAdded: RemoteRealtimeSession._content_part_added,
    se.ResponseOutputAudioDelta: RemoteRealtimeSession._audio_delta,
    se.ResponseOutputAudioTranscriptDelta: RemoteRealtimeSession._text_delta,
    se.ResponseOutputTextDelta: RemoteRealtimeSession._text_delta,
    se.ResponseDone: RemoteRealtimeSession._response_done,
    se.Error: RemoteRealtimeSession._error,
}
"""Server event model → handler; other events (``session.*``, ``*.done`` of parts, …) need nothing."""
