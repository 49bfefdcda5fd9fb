"""The cascade's TTS stage over a continuous-batching TTS engine: the plumbing Qwen3-TTS
(:mod:`.qwen3_tts_stage`) and the other families' runners (:mod:`.runner_tts`) share.

Contract: the same as the Piper stage (:mod:`.tts`). Input: one message per LLM token, meta ``text`` = its
text delta, ``last`` when the reply's text is complete; ``skipped`` on the first message is passed through.
Output: ``pcm`` float32 ``[n]`` at the graph's rate, meta ``text``, ``chunk`` (0, 1, ... per turn) and
``tts_ms``, ``last=False``; then one ``last=True`` message (empty ``pcm``, meta ``text`` "").

Each clause (:class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`) is one utterance on the engine, its
events streamed through its own decoder, each frame decoded once. A turn speaks one clause at a time, in
order; the next starts in the step its predecessor ends. The clause's text rides on its first piece (a
clause with no audio still sends its text, with empty ``pcm``), so the chunk texts in order are the reply
and an interrupted reply is cut back at clause granularity, as with Piper. ``tts_ms`` is the time from the
clause's admission to that piece. A clause the voice cannot speak goes out as text with no audio (logged).

A worker gives :meth:`~EngineTTSStageWorker.voice_for`, :meth:`~EngineTTSStageWorker._admit` (check and
queue one clause, returning its decoder) and :meth:`~EngineTTSStageWorker._pieces` (one engine event →
float32 pieces).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from omniduplex.pipeline.messages import AudioOutput, DecoderOutput, StageMessage
from omniduplex.pipeline.stages.contract import EngineGauges
from omniduplex.pipeline.stages.tts_intake import AbortedTurns, TextTurn, add_text_delta
from omniduplex.pipeline.text.clauses import ClauseSplitter

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class _Turn(TextTurn):
    voice: Any
    active: str | None = None  # engine request id of the clause being spoken
    stream: Any = None  # the active clause's decoder
    text: str = ""  # the active clause's text, until its first piece carries it
    started_at: float = 0.0


class EngineTTSStageWorker(EngineGauges, ABC):
    """Streaming synthesis of every reply in flight on one engine (module docstring).

    Subclasses set ``tts`` (the engine: ``add / abort / has_unfinished / step``), ``engine`` (its
    :class:`~omniduplex.pipeline.engine.engine.Engine`, for the KV gauges), ``voice``, ``output_rate``,
    ``first_max_words``, ``min_words``, then call :meth:`_init_turns`."""

    tts: Any
    voice: Any
    first_max_words: int
    min_words: int

    def _init_turns(self) -> None:
        self.turns: dict[str, _Turn] = {}
        self._by_request: dict[str, str] = {}  # engine request id → turn id
        self._aborted = AbortedTurns()
        self._n = 0

    @abstractmethod
    def voice_for(self, name: str | None) -> Any:
        """The voice of a turn whose first message asks for ``name`` (the stage's voice when it cannot)."""

    @abstractmethod
    def _admit(self, request_id: str, text: str, voice: Any) -> Any:
        """Check ``text`` in ``voice``, queue it on the engine as ``request_id`` and return its decoder.

        Raises ValueError: the voice cannot speak this clause (nothing queued)."""

    @abstractmethod
    def _pieces(self, decoder: Any, event: Any) -> list[torch.Tensor]:
        """float32 pieces ``[n]`` at the output rate that ``event`` completes (the rest when it finishes)."""

    def submit(self, msg: StageMessage) -> None:
        """Add a text delta (a :class:`~omniduplex.pipeline.messages.DecoderOutput`'s ``text``) to its turn;
        ``last`` closes the turn's text.

        Raises ValueError: not a ``DecoderOutput`` (this turn only).
        """
        add_text_delta(msg, self._aborted, self.turns, self._new_turn)

    def _new_turn(self, meta: DecoderOutput) -> _Turn:
        splitter = ClauseSplitter(self.first_max_words, self.min_words)
        return _Turn(splitter, meta.skipped, voice=self.voice_for(meta.options.voice))

    def abort(self, request_id: str) -> None:
        """Drop the turn at once (its clause leaves the engine); later text for it is ignored."""
        t = self.turns.pop(request_id, None)
        if t is not None and t.active is not None:
            self.tts.abort(t.active)
            self._by_request.pop(t.active, None)
        self._aborted.add(request_id)

    def has_work(self) -> bool:
        return self.tts.has_unfinished() or any(
            t.active is None and (t.clauses or t.finished) for t in self.turns.values()
        )

    def step(self) -> list[StageMessage]:
        """Admit the next clause of every idle turn (or close a turn whose text is all spoken), then one
        engine step: every piece the decoders complete goes out."""
        outs: list[StageMessage] = []
        for rid, t in list(self.turns.items()):
            while t.active is None and t.clauses:
                self._start(rid, t, outs)
            if t.active is None and t.finished and not t.clauses:
                outs.append(self._last(rid, t))
        if not self.tts.has_unfinished():
            return outs
        for ev in self.tts.step():
            rid = self._by_request.get(ev.request_id)
            t = self.turns.get(rid) if rid is not None else None
            if t is None:
                continue
            for p in self._pieces(t.stream, ev):
                outs.append(self._message(rid, t, p))
            if ev.finished:
                if t.text:  # no frames at all: the clause's text still goes out
                    outs.append(self._message(rid, t, torch.zeros(0)))
                del self._by_request[ev.request_id]
                t.active = t.stream = None
                while t.clauses and t.active is None:
                    self._start(rid, t, outs)
                if t.active is None and t.finished and not t.clauses:
                    outs.append(self._last(rid, t))
        return outs

    def _start(self, rid: str, t: _Turn, outs: list[StageMessage]) -> None:
        """Admit ``t``'s next clause; one the voice cannot speak goes out as text with no audio."""
        text = t.clauses.popleft()
        t.text, t.started_at = text, time.perf_counter()
        self._n += 1
        req = f"{rid}.{self._n}"
        try:
            stream = self._admit(req, text, t.voice)
        except ValueError as e:
            log.warning("turn %s: clause not spoken (%s)", rid, e)
            outs.append(self._message(rid, t, torch.zeros(0)))
            return
        t.active, t.stream = req, stream
        self._by_request[req] = rid

    def _message(self, rid: str, t: _Turn, pcm: torch.Tensor) -> StageMessage:
        ms = 1000 * (time.perf_counter() - t.started_at)
        meta = AudioOutput(text=t.text, chunk=t.chunk, tts_ms=ms, skipped=t.skipped)
        t.text = ""
        t.chunk += 1
        return StageMessage(rid, {"pcm": pcm}, meta, last=False)

    def _last(self, rid: str, t: _Turn) -> StageMessage:
        del self.turns[rid]
        return StageMessage(rid, {"pcm": torch.zeros(0)}, AudioOutput(text="", skipped=t.skipped), last=True)
