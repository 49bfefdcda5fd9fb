"""What both plugins (in-process and remote) hand the framework: a reply as a ``generation_created`` event,
the capabilities they claim, and the ``error`` event.

Contract (``livekit/agents/llm/realtime.py`` 1.8.9, and how ``voice/agent_activity.py`` consumes it):

* ``GenerationCreatedEvent.message_stream`` yields one :class:`llm.MessageGeneration` per assistant message
  of the reply; ``function_stream`` yields the function calls it makes (``llm.FunctionCall``, the in-process
  plugin: :mod:`.tools`). The framework treats the reply as
  still generating until **both** streams end, and only then stops sending ``interrupt()`` for it, so they
  stay open until the reply is over (completed, interrupted, failed).
* A message's ``text_stream`` carries transcript deltas (str), ``audio_stream`` :class:`rtc.AudioFrame` s
  (any rate; the framework plays them through the room's audio output, which paces them in real time and
  reports the played position back as ``truncate(audio_end_ms=...)`` when the reply is interrupted);
  ``modalities`` resolves to ``["audio", "text"]``.
* ``user_initiated`` is True for the reply ``generate_reply()`` asked for (its future resolves with the same
  event; the framework ignores the emitted copy), False for replies the model started itself (server-side
  turn detection), which the framework schedules as new speech.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass
from typing import Literal

from livekit import rtc
from livekit.agents import llm, utils
from livekit.agents.types import NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given


class Message:
    """One assistant message of a reply: transcript deltas and audio frames, until :meth:`close`."""

    def __init__(self, message_id: str, modalities: list[Literal["text", "audio"]] | None = None) -> None:
        self.id = message_id
        self.text = utils.aio.Chan[str]()
        self.audio = utils.aio.Chan[rtc.AudioFrame]()
        self.modalities: asyncio.Future[list[Literal["text", "audio"]]] = asyncio.Future()
        if modalities is not None:
            self.modalities.set_result(modalities)

    def set_modalities(self, modalities: list[Literal["text", "audio"]]) -> None:
        if not self.modalities.done():
            self.modalities.set_result(modalities)

    def push_text(self, text: str) -> None:
        if text and not self.text.closed:
            self.text.send_nowait(text)

    def push_audio(self, frame: rtc.AudioFrame) -> None:
        if not self.audio.closed:
            self.audio.send_nowait(frame)

    def close(self) -> None:
        self.set_modalities(["audio", "text"])
        for ch in (self.text, self.audio):
            if not ch.closed:
                ch.close()

    def generation(self) -> llm.MessageGeneration:
        return llm.MessageGeneration(
            message_id=self.id, text_stream=self.text, audio_stream=self.audio, modalities=self.modalities
        )


class Generation:
    """One reply (``response_id``) as the framework sees it; :meth:`close` ends every stream of it."""

    def __init__(self, response_id: str) -> None:
        self.response_id = response_id
        self.messages = utils.aio.Chan[llm.MessageGeneration]()
        self.functions = utils.aio.Chan[llm.FunctionCall]()
        self.by_id: dict[str, Message] = {}
        self.closed = False

    def open_message(
        self, message_id: str, modalities: list[Literal["text", "audio"]] | None = None
    ) -> Message:
        msg = self.by_id[message_id] = Message(message_id, modalities)
        if not self.messages.closed:
            self.messages.send_nowait(msg.generation())
        return msg

    def created_event(self, user_initiated: bool) -> llm.GenerationCreatedEvent:
        return llm.GenerationCreatedEvent(
            message_stream=self.messages,
            function_stream=self.functions,
            user_initiated=user_initiated,
            response_id=self.response_id,
        )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for msg in self.by_id.values():
            msg.close()
        self.messages.close()
        self.functions.close()


def pipeline_capabilities(user_transcription: bool, tools: bool = False) -> llm.RealtimeCapabilities:
    """What the pipeline does, as the framework asks it.

    True: ``message_truncation`` (``truncate`` cuts our history to the played audio), ``turn_detection``
    (our VAD/end-of-turn reports speech start/stop and starts replies), ``audio_output``,
    ``mutable_chat_context`` and ``mutable_instructions`` (both apply from the next reply on).
    ``user_transcription``: the graph transcribes the user (the cascade's ASR, or a side ASR stage).
    ``tools``: the plugin passes function tools through (``mutable_tools``, ``per_response_tool_choice``;
    the in-process plugin). False: ``auto_tool_reply_generation`` (the framework asks for the reply to a
    tool result), ``manual_function_calls``, ``can_disable_turn_detection``
    (turn-taking is always ours), ``supports_overlapping_speech`` (a user turn interrupts the reply),
    ``supports_say`` (no text-to-speech entry point outside a reply).
    """
    return llm.RealtimeCapabilities(
        message_truncation=True,
        turn_detection=True,
        user_transcription=user_transcription,
        auto_tool_reply_generation=False,
        audio_output=True,
        manual_function_calls=False,
        can_disable_turn_detection=False,
        supports_overlapping_speech=False,
        mutable_chat_context=True,
        mutable_instructions=True,
        mutable_tools=tools,
        per_response_tool_choice=tools,
        supports_say=False,
    )


def model_error(label: str, error: Exception, recoverable: bool) -> llm.RealtimeModelError:
    """The payload of a realtime session's ``error`` event. ``recoverable=False`` makes the AgentSession
    close (the agent leaves the room); recoverable errors are reported and the session goes on."""
    return llm.RealtimeModelError(timestamp=time.time(), label=label, error=error, recoverable=recoverable)


class PipelineModel(llm.RealtimeModel):
    """What both plugins' models share: the pipeline's capabilities (:func:`pipeline_capabilities`), the
    name the framework reports, and the sessions the model made (closed by :meth:`aclose`)."""

    def __init__(self, user_transcription: bool, tools: bool = False) -> None:
        super().__init__(capabilities=pipeline_capabilities(user_transcription, tools))
        self.sessions: weakref.WeakSet[llm.RealtimeSession] = weakref.WeakSet()

    @property
    def model(self) -> str:
        return "omniduplex"

    @property
    def provider(self) -> str:
        return "omniduplex"

    async def aclose(self) -> None:
        """Close every session this model made."""
        await asyncio.gather(*(s.aclose() for s in list(self.sessions)))


ReplyFuture = asyncio.Future[llm.GenerationCreatedEvent]
"""What ``generate_reply`` returns: resolves with the reply's ``user_initiated`` generation."""


@dataclass
class ReplyAsk:
    """What a ``generate_reply`` call asked for: ``instructions`` added to the system prompt for this reply
    only (``None``: none); ``tools`` / ``tool_choice`` for this reply (``NOT_GIVEN``: the session's)."""

    instructions: str | None
    tools: NotGivenOr[list[llm.Tool]]
    tool_choice: NotGivenOr[llm.ToolChoice]


class ReplySession(llm.RealtimeSession):
    """What both plugins' sessions share: no video, and ``generate_reply``'s future.

    A subclass says why no reply can start now (:meth:`_unavailable`) and starts one (:meth:`_start_reply`).
    """

    def push_video(self, frame: rtc.VideoFrame) -> None:
        """Ignored: the pipeline takes no video."""

    def generate_reply(
        self,
        *,
        instructions: NotGivenOr[str] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        tools: NotGivenOr[list[llm.Tool]] = NOT_GIVEN,
    ) -> asyncio.Future[llm.GenerationCreatedEvent]:
        """Start a reply now (see :meth:`_start_reply`); the future resolves with its ``user_initiated``
        generation, or fails with ``RealtimeError`` (at once, naming :meth:`_unavailable`'s reason, when
        no reply can start)."""
        fut: ReplyFuture = asyncio.get_running_loop().create_future()
        down = self._unavailable()
        if down is not None:
            fut.set_exception(llm.RealtimeError(down))
            return fut
        text = instructions if is_given(instructions) and instructions else None
        self._start_reply(fut, ReplyAsk(text, tools, tool_choice))
        return fut

    def _unavailable(self) -> str | None:
        """Why no reply can start now, or ``None``."""
        raise NotImplementedError

    def _start_reply(self, fut: ReplyFuture, ask: ReplyAsk) -> None:
        """Start the reply ``fut`` waits for, as ``ask`` says."""
        raise NotImplementedError
