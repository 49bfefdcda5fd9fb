"""The session ↔ orchestrator contract: start a reply to a user turn, stream it, cancel it.

A :class:`Responder` turns one committed user turn (16 kHz mono float32 audio + history) into a
stream of typed :data:`ReplyEvent` s (the orchestrator's own events, :mod:`omniduplex.pipeline.events`).
:class:`OrchestratorResponder` is the real one, over :class:`~omniduplex.pipeline.orchestrator.Orchestrator`;
tests script their own.

A responder may also transcribe a turn while it is spoken (:class:`LiveTranscription`): the session feeds
it the open turn's audio and gets partial transcripts back; ``start`` then finishes that turn.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import numpy as np

from omniduplex.models.tokenizer import DEFAULT_SYSTEM_PROMPT
from omniduplex.pipeline.events import (
    ReplyAudioChunk,
    ReplyDone,
    ReplyFailed,
    ReplyTextDelta,
    TurnEvent,
    UserTranscript,
)
from omniduplex.pipeline.messages import Prefill, TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT, date_context, spoken_tools_prompt

__all__ = [
    "LiveTranscription",
    "OrchestratorResponder",
    "ReplyAudioChunk",
    "ReplyDone",
    "ReplyEvent",
    "ReplyFailed",
    "ReplyTextDelta",
    "Responder",
    "UserTranscript",
]


ReplyEvent = TurnEvent
"""The orchestrator's own events (:mod:`omniduplex.pipeline.events`), passed on as they are."""
OnPartial = Callable[[str, str], None]
"""``on_partial(text, stable)``: a partial transcript of a turn being spoken; ``stable``: its fixed prefix."""
TurnContext = tuple[list[list[str]], dict[str, Any]]
"""``(history, options)`` as :meth:`Responder.start` gets them."""


class Responder(Protocol):
    """Where replies come from.

    Contract: after :meth:`start`, :meth:`events` yields the turn's events and always ends with
    exactly one :class:`ReplyDone` or :class:`ReplyFailed`; the caller must consume it to that end
    (that is what frees the turn). :meth:`cancel` makes the stream end with ``ReplyFailed("cancelled")``
    promptly and frees the turn's pipeline resources; it does nothing if the turn already ended.
    """

    output_rate: int
    """Sample rate of :class:`ReplyAudioChunk` PCM (Hz)."""

    def start(
        self,
        turn_id: str,
        waveform: np.ndarray,
        history: list[list[str]],
        options: dict[str, Any] | None = None,
    ) -> None:
        """Start a reply. ``waveform``: the user's turn, 16 kHz mono float32 (may be empty for a typed turn).
        ``options``: ``user_text`` (a typed turn: the user's words; "" = answer the conversation as it
        stands), ``system_prompt`` (the session's, replacing the server default), ``instructions`` (added
        to the system prompt for this reply only), ``metadata`` (travels with the turn), ``voice`` (the
        session's TTS voice), ``tools`` / ``tool_choice`` (function tools the reply may call:
        :mod:`~omniduplex.app.core.tools`; its calls then stream as :data:`~.tools.CallEvent` s),
        ``sampling`` (LLM sampling fields over the server's: ``max_tokens``, ``temperature``, ``top_p``,
        ``seed``), ``spoken`` (``False``: a text-only turn, as ``/v1/chat/completions`` asks: no audio),
        ``say`` (words spoken as written, not generated: a tool call's filler or apology).
        ``history`` holds ``[role, text]`` pairs and tool items (:meth:`.history.Entry.wire`)."""

    def events(self, turn_id: str) -> AsyncIterator[ReplyEvent]: ...

    def cancel(self, turn_id: str) -> None: ...


class LiveTranscription(Protocol):
    """Optional half of a :class:`Responder`: transcribe a turn while the user speaks it.

    ``feed_audio(turn_id, samples, on_partial, context)`` sends the next samples (16 kHz mono float32) of a
    turn not started yet and returns ``True``, or returns ``False`` when it cannot (the graph has no ASR
    entry; the caller then just calls :meth:`Responder.start` with the whole turn). ``on_partial(text,
    stable)`` gets the partial transcripts (``stable``: the prefix that will not change). ``context``, given
    with a turn's first samples: ``(history, options)`` as :meth:`Responder.start` would get them now, so the
    LLM can prefill the conversation and the words heard before the turn ends. ``start(turn_id, waveform,
    ...)`` gets the whole turn's audio (the fed samples its prefix) and sends only the rest;
    ``cancel(turn_id)`` drops a fed turn that will not be started.
    """

    def feed_audio(
        self, turn_id: str, samples: np.ndarray, on_partial: OnPartial, context: TurnContext | None = None
    ) -> bool: ...


class OrchestratorResponder:
    """A :class:`Responder` over the pipeline orchestrator, shared by every session of a server.

    ``meta``: the server's defaults of every turn's options (``sampling``, ``talker_sampling``, ``speaker``,
    ``system_prompt``: :class:`~omniduplex.pipeline.messages.TurnOptions`); ``history`` is set per turn.
    """

    def __init__(self, orchestrator: Orchestrator, meta: TurnOptions | None = None) -> None:
        self.orch, self.defaults = orchestrator, meta or TurnOptions()
        self.output_rate = orchestrator.output_rate

    def start(
        self,
        turn_id: str,
        waveform: np.ndarray,
        history: list[list[str]],
        options: dict[str, Any] | None = None,
    ) -> None:
        opts = self._turn_options(history, options or {})
        user_text = (options or {}).get("user_text")
        if user_text is not None and not waveform.size:
            opts.user_text = user_text
        self.orch.submit(waveform, opts, request_id=turn_id)

    def _turn_options(self, history: list[list[str]], opts: dict[str, Any]) -> TurnOptions:
        """The pipeline's options of a turn: the server's defaults, the history, and the reply's options
        (``system_prompt``, ``instructions``, ``voice``, ``tools``, ``tool_choice``, ``sampling``,
        ``spoken``, ``say``, ``call_filler`` / ``call_filler_tools``). A turn with tools whose prompt
        would be the cascade's spoken default
        (:data:`~omniduplex.pipeline.text.spoken.SPOKEN_SYSTEM_PROMPT`) gets the spoken tools prompt
        with today's date instead (:func:`~omniduplex.pipeline.text.spoken.spoken_tools_prompt`,
        :func:`~omniduplex.pipeline.text.spoken.date_context`), the prompt ``bench tools`` measures."""
        d = self.defaults
        prompt = opts.get("system_prompt") or d.system_prompt or DEFAULT_SYSTEM_PROMPT
        if opts.get("tools") and prompt == SPOKEN_SYSTEM_PROMPT:  # the cascade's default, with tools:
            # what `bench tools` measures — the tools' uses, when not to call, today's date
            uses = [t.get("description", "") for t in opts["tools"] if isinstance(t, dict)]
            prompt = spoken_tools_prompt(uses, date_context(datetime.date.today()))
        if opts.get("instructions"):
            prompt = f"{prompt}\n\n{opts['instructions']}"
        turn = d.model_copy(update={"history": history, "system_prompt": prompt})
        if opts.get("voice"):
            turn.voice = opts["voice"]  # the cascade's LLM stage passes it on to the TTS stage
        if opts.get("tools"):
            turn.tools, turn.tool_choice = list(opts["tools"]), opts.get("tool_choice") or "auto"
        if opts.get("sampling"):
            turn.sampling = {**(d.sampling or {}), **opts["sampling"]}
        if opts.get("spoken") is False:
            turn.spoken = False
        if isinstance(opts.get("say"), str):
            turn.say = opts["say"]
        if opts.get("tools") and opts.get("call_filler"):  # said as a server-run call opens
            turn.call_filler = opts["call_filler"]
            turn.call_filler_tools = list(opts.get("call_filler_tools") or [])
        return turn

    def events(self, turn_id: str) -> AsyncIterator[ReplyEvent]:
        """The turn's events as the orchestrator makes them (:mod:`omniduplex.pipeline.events`)."""
        return self.orch.events(turn_id)

    def feed_audio(
        self, turn_id: str, samples: np.ndarray, on_partial: OnPartial, context: TurnContext | None = None
    ) -> bool:
        """:class:`LiveTranscription` over :meth:`Orchestrator.feed` (cascade graphs only); ``context``
        becomes the turn's ``prefill`` (system prompt and history) for the LLM stage's prefill hints."""
        if not self.orch.live_asr:
            return False
        prefill = None
        if context is not None:
            turn = self._turn_options(*context)
            # its tools too: rendered into the prompt, the hint must hold them to be its prefix
            prefill = Prefill(
                system_prompt=turn.system_prompt or "",
                history=turn.history or [],
                tools=turn.tools,
                tool_choice=turn.tool_choice,
            )
        self.orch.feed(turn_id, samples, on_partial, prefill)
        return True

    def cancel(self, turn_id: str) -> None:
        self.orch.cancel(turn_id)
