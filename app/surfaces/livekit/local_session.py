"""The in-process plugin's session: a LiveKit ``RealtimeSession`` over one
:class:`~omniduplex.app.core.session.Session` (our VAD, end of turn, barge-in, history, playout).

Framework → session (the contract of each method is in its docstring):
``push_audio`` → 20 ms 16 kHz frames into :meth:`Session.push_audio`; ``generate_reply`` →
:meth:`Session.respond`; ``interrupt`` → :meth:`Session.cancel_reply`; ``truncate`` →
:meth:`Session.truncate`; ``update_instructions`` → :meth:`Session.set_options`; ``update_chat_ctx`` → the
history (:mod:`.chat_sync`, function calls and outputs included); ``update_tools`` / ``update_options``
→ the session's tools and tool choice (:mod:`.tools`); ``commit_audio`` / ``clear_audio`` → a manual
commit of the audio since the last turn / dropping it (the core's
:class:`~omniduplex.app.core.input_buffer.InputAudioBuffer`).

Session → framework: ``UserSpeechStarted`` / ``BargeIn`` / ``UserTurnCommitted`` → ``input_speech_started``
/ ``input_speech_stopped`` (policy: :mod:`.turn_signals`); ``UserTranscriptEvent`` →
``input_audio_transcription_completed``; ``ReplyStarted`` → ``generation_created``; ``ReplyText`` → the
message's text stream; a ``ToolCall`` whose call is done → an ``llm.FunctionCall`` on its function stream
(the framework runs the tool, then ``update_chat_ctx`` + ``generate_reply``); reply audio → its audio stream;
``ReplyEnded`` → the streams end; a failed reply or ``SessionError`` → ``error`` (recoverable).

Room audio goes through the session's :class:`~omniduplex.app.core.audio.AudioPort` (16 kHz, 20 ms
frames). Reply audio is pulled from it on every tick of its 20 ms clock and forwarded at most ``lead_s`` ahead
of real time: the framework's audio output plays in real time, so the session's idea of
"played" stays within ``lead_s`` of the truth (its barge-in and history rules keep working), and the
framework's ``truncate(audio_end_ms)`` then corrects the history to what the room really heard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Literal

import numpy as np
from livekit import rtc
from livekit.agents import llm
from livekit.agents.types import NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given

from omniduplex.app.core import events as se
from omniduplex.app.core.audio import AudioPort
from omniduplex.app.core.input_buffer import InputAudioBuffer
from omniduplex.app.core.replies import Responder
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.tools import CallDone
from omniduplex.app.surfaces.livekit import tools as lk_tools
from omniduplex.app.surfaces.livekit.audio import frame_pcm, pcm_frame
from omniduplex.app.surfaces.livekit.chat_sync import ItemIds, apply_chat_ctx, history_chat_ctx
from omniduplex.app.surfaces.livekit.generation import (
    Generation,
    Message,
    ReplyAsk,
    ReplyFuture,
    ReplySession,
    model_error,
)
from omniduplex.app.surfaces.livekit.turn_signals import SpeechSignals

log = logging.getLogger("omniduplex.livekit")

OUTPUT_RATE = 24_000
"""Rate of the reply audio frames handed to the framework (Hz)."""
MAX_MANUAL_S = 60.0
"""Audio kept for a manual ``commit_audio`` (s); older audio is dropped."""


class PipelineRealtimeSession(ReplySession):
    """One room conversation over the shared pipeline ``responder``.

    Args:
        model: the :class:`~.local_model.PipelineRealtimeModel` that made it.
        session_id: names the session and its turn ids.
        responder: the pipeline (shared by every session of the process).
        cfg: turn thresholds and history size (``output_rate`` is set to 24 kHz).
        turn_model: the Smart Turn model when ``cfg.turn.turn_detection == "smart"``.
        lead_s: how far ahead of real time reply audio is forwarded (s).
    """

    def __init__(
        self,
        model: llm.RealtimeModel,
        session_id: str,
        responder: Responder,
        cfg: SessionConfig,
        turn_model=None,
        lead_s: float = 0.2,
    ) -> None:
        super().__init__(model)
        self.lead_s = lead_s
        self._gens: dict[str, tuple[Generation, Message]] = {}  # turn id → its reply, while in flight
        self._turn_of: dict[str, str] = {}  # message id → turn id (truncate)
        self._reply_future: asyncio.Future[llm.GenerationCreatedEvent] | None = None
        self._own_cancel = False  # a BargeIn caused by interrupt()/respond() is not user speech
        self._committed = False
        self._closed = False
        self._sink_end = 0.0  # monotonic time at which the forwarded reply audio has all played
        self._manual = InputAudioBuffer(MAX_MANUAL_S)  # audio since the last turn (commit_audio)
        self._signals = SpeechSignals()
        self._ids = ItemIds()
        self._tools: list[llm.Tool] = []
        self.session = Session(
            session_id,
            responder,
            self._on_event,
            replace(cfg, output_rate=OUTPUT_RATE),
            turn_model=turn_model,
        )
        self.port = AudioPort(self.session, OUTPUT_RATE)
        self._pump = asyncio.get_running_loop().create_task(
            self.port.run(self._tick), name=f"lk-pump-{session_id}"
        )

    # -- the framework's view -------------------------------------------------------------------------
    @property
    def chat_ctx(self) -> llm.ChatContext:
        """The conversation the pipeline will answer from (our history, with stable item ids)."""
        return history_chat_ctx(self.session.history, self._ids)

    @property
    def tools(self) -> llm.ToolContext:
        """The tools every reply is offered (``update_tools``)."""
        return llm.ToolContext(self._tools)

    # -- framework → pipeline -------------------------------------------------------------------------
    def push_audio(self, frame: rtc.AudioFrame) -> None:
        """User audio from the room, any rate / channel count; the session runs VAD and turn-taking on it."""
        if self._closed:
            return
        for pcm in self.port.frames(self.port.resample(*frame_pcm(frame))):
            in_speech = self.session.in_speech
            self._committed = False
            self._manual.append(pcm)
            self.session.push_audio(pcm)
            if in_speech and not self.session.in_speech and not self._committed:
                self._signal(self._signals.dropped())

    def _unavailable(self) -> str | None:
        return "the realtime session is closed" if self._closed else None

    def _start_reply(self, fut: ReplyFuture, ask: ReplyAsk) -> None:
        """A reply now (a reply in flight is cancelled first). It answers the committed spoken turn, else
        the conversation as it stands (a trailing user message is the turn's text); ``fut`` resolves as soon
        as the pipeline accepted the turn."""
        self._reply_future = fut
        try:
            with self._cancelling():
                tools = self._reply_tools(ask.tools, ask.tool_choice)
                turn = self.session.respond(ask.instructions, tools=tools)
        finally:
            self._reply_future = None
        if turn is None and not fut.done():
            fut.set_exception(llm.RealtimeError("the pipeline could not start a reply"))

    def interrupt(self) -> None:
        """Cancel the reply in flight (playout flushed, pipeline turn cancelled, history keeps what was
        forwarded until ``truncate`` says what was played); does nothing if no reply is in progress."""
        with self._cancelling():
            self.session.cancel_reply()

    def truncate(
        self,
        *,
        message_id: str,
        modalities: list[Literal["text", "audio"]],
        audio_end_ms: int,
        audio_transcript: NotGivenOr[str] = NOT_GIVEN,
    ) -> None:
        """The room played only ``audio_end_ms`` ms of assistant message ``message_id``: its history entry
        keeps the words of that audio (text↔audio alignment). A reply still playing is stopped first; the
        session applies it in any order relative to the reply's end. Unknown ids are ignored."""
        turn_id = self._turn_of.get(message_id)
        if turn_id is None:
            log.debug("truncate: unknown message %s", message_id)
            return
        try:
            with self._cancelling():
                self.session.truncate(turn_id, max(0, audio_end_ms))
        except ValueError as err:
            log.warning("truncate %s at %d ms: %s", turn_id, audio_end_ms, err)

    async def update_instructions(self, instructions: str) -> None:
        """The system prompt of every reply from now on (``""`` → the pipeline's default)."""
        self.session.set_options(instructions=instructions or None)

    async def update_chat_ctx(self, chat_ctx: llm.ChatContext) -> None:
        """Make the conversation ``chat_ctx``'s user and assistant text messages (see :mod:`.chat_sync`);
        the next reply answers from it."""
        apply_chat_ctx(self.session.history, self._ids, chat_ctx)

    async def update_tools(self, tools: list[llm.Tool]) -> None:
        """The function tools every reply is offered from now on (the agent's ``@function_tool`` s)."""
        self._tools = list(tools)
        self.session.set_options(tools=lk_tools.function_tools(self._tools) or None)

    def update_options(self, *, tool_choice: NotGivenOr[llm.ToolChoice | None] = NOT_GIVEN) -> None:
        """How replies may use the tools from now on (``None``: ``auto``)."""
        if is_given(tool_choice):
            self.session.set_options(tool_choice=lk_tools.tool_choice(tool_choice))

    def _reply_tools(self, tools: NotGivenOr[list], choice: NotGivenOr[llm.ToolChoice]) -> dict | None:
        """One reply's own ``{"tools", "tool_choice"}`` (``None``: the session's)."""
        if not is_given(tools) and not is_given(choice):
            return None
        offered = lk_tools.function_tools(tools) if is_given(tools) else self.session.cfg.tools or []
        return {"tools": offered, "tool_choice": lk_tools.tool_choice(choice) if is_given(choice) else "auto"}

    def commit_audio(self) -> None:
        """Commit the user audio since the last turn as a turn now (whatever the VAD says); the framework's
        ``generate_reply`` then answers it. Under 100 ms of audio: nothing happens."""
        wav = self._manual.take()
        if wav is None:
            return
        self.clear_audio()
        self.session.commit_audio(wav, respond=False)

    def clear_audio(self) -> None:
        """Drop the user audio since the last turn, and the VAD's open speech segment with it."""
        self._manual.clear()
        if self.session.drop_speech():
            self._signal(self._signals.dropped())

    async def aclose(self) -> None:
        """Cancel the reply in flight (its pipeline turn is freed) and end the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        await self.session.close("closed")
        for gen, _ in list(self._gens.values()):
            gen.close()
        self._gens.clear()

    # -- pipeline → framework -------------------------------------------------------------------------
    def _on_event(self, e: se.SessionEvent) -> None:
        if isinstance(e, se.UserSpeechStarted):
            self._signal(self._signals.speech_started(self._replying()))
        elif isinstance(e, se.BargeIn) and not self._own_cancel:
            self._signal(self._signals.barge_in())
        elif isinstance(e, se.UserTurnCommitted):
            self._committed = True
            self._manual.clear()
            self._ids.name(self.session.entry(e.turn_id, "user"), f"{e.turn_id}-user")
            self._signal(self._signals.committed())
        elif isinstance(e, se.UserTranscriptEvent):
            self._transcript(e)
        elif isinstance(e, se.ReplyStarted):
            self._start_generation(e.turn_id)
        elif isinstance(e, se.ReplyText) and e.turn_id in self._gens:
            self._gens[e.turn_id][1].push_text(e.text)
        elif isinstance(e, se.ToolCall) and self._client_call(e):
            c = e.call
            call = llm.FunctionCall(call_id=c.call_id, name=c.name, arguments=c.arguments)
            self._ids.name(self.session.history.call(c.call_id), call.id)
            self._gens[e.turn_id][0].functions.send_nowait(call)
        elif isinstance(e, se.ReplyEnded):
            self._end_generation(e)
        elif isinstance(e, se.SessionError):
            self.emit("error", model_error(self.realtime_model.label, llm.RealtimeError(e.message), True))

    def _client_call(self, e: se.ToolCall) -> bool:
        """Whether ``e`` is a finished call of a generation in flight that the framework runs."""
        return isinstance(e.call, CallDone) and e.turn_id in self._gens and not e.run_here

    def _signal(self, signals: list[str]) -> None:
        transcribes = self.realtime_model.capabilities.user_transcription
        for s in signals:
            if s == "started":
                self.emit("input_speech_started", llm.InputSpeechStartedEvent())
            else:
                enabled = transcribes and s == "stopped"
                self.emit(
                    "input_speech_stopped", llm.InputSpeechStoppedEvent(user_transcription_enabled=enabled)
                )

    def _transcript(self, e: se.UserTranscriptEvent) -> None:
        item_id = f"{e.turn_id}-user"
        self._ids.name(self.session.entry(e.turn_id, "user"), item_id)
        if e.text:
            self.emit(
                "input_audio_transcription_completed",
                llm.InputTranscriptionCompleted(item_id=item_id, transcript=e.text, is_final=True),
            )

    def _start_generation(self, turn_id: str) -> None:
        gen = Generation(turn_id)
        msg = gen.open_message(f"{turn_id}-reply", ["audio", "text"])
        self._gens[turn_id] = (gen, msg)
        self._turn_of[msg.id] = turn_id
        self._sink_end = 0.0
        fut, user_initiated = self._reply_future, self._reply_future is not None
        ev = gen.created_event(user_initiated)
        if fut is not None and not fut.done():
            fut.set_result(ev)
        self.emit("generation_created", ev)

    def _end_generation(self, e: se.ReplyEnded) -> None:
        held = self._gens.pop(e.turn_id, None)
        if held is None:
            return
        gen, msg = held
        self._ids.name(self.session.entry(e.turn_id, "assistant"), msg.id)
        gen.close()
        if e.reason == "error":
            err = llm.RealtimeError(f"reply {e.turn_id} failed in the pipeline: {e.error}")
            self.emit("error", model_error(self.realtime_model.label, err, True))

    # -- reply audio ---------------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        """One tick of the port's 20 ms clock (``now``: its due time, monotonic s): forward what is due."""
        try:
            self._pull(now)
        except Exception:  # keep pumping: one bad frame must not silence the room
            log.exception("%s: reply audio pump failed", self.session.id)

    def _pull(self, now: float) -> None:
        """Forward queued reply audio until the framework's sink holds ``lead_s`` of it; one pull with
        nothing queued lets the session end a finished or interrupted reply."""
        s = self.session
        while s.reply_turn_id is not None:
            if s.queued_samples and self._sink_end - now >= self.lead_s:
                return
            held = self._gens.get(s.reply_turn_id)

            def forward(pcm: np.ndarray, filled: int, held=held, now=now) -> None:
                if filled and held is not None:  # before the events of this pull (the reply's end)
                    held[1].push_audio(pcm_frame(pcm[:filled], OUTPUT_RATE))
                    self._sink_end = max(self._sink_end, now) + filled / OUTPUT_RATE

            if not self.port.pull(None, forward)[1]:
                return

    # -- helpers -------------------------------------------------------------------------------------
    def _replying(self) -> bool:
        return self.session.replying

    @contextlib.contextmanager
    def _cancelling(self):
        self._own_cancel = True
        try:
            yield
        finally:
            self._own_cancel = False
