"""The orchestrator: submit a turn, get an async stream of events, cancel it anywhere in the graph.

It speaks to a :class:`Backend` (stages in this process, or stage processes joined by the relay) and
turns the ASR stage's transcript into a ``transcript`` event (the user's words), the text stage's tokens
(Thinker, unified LM, cascade LLM) into reply-text deltas and the last stage's PCM (Code2Wav, DAC, Piper)
into audio chunks, measuring TTFP (turn submitted → first PCM chunk), E2EL, RTF and, for the cascade, the
per-stage split of TTFP on the way (each turn's state and the reading of its outputs: :mod:`.turn_state`).

Live transcription (cascade graphs, whose one entry stage is the ASR): :meth:`Orchestrator.feed` sends the
audio of a turn still being spoken to the ASR stage in pieces; its partial transcripts go to the turn's
``on_partial`` callback, and :meth:`Orchestrator.submit` then sends only the samples not fed yet, so at end
of turn the ASR decodes only the tail (see :mod:`.stages.asr`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import numpy as np
import torch
from tokenizers import Tokenizer

from omniduplex.pipeline.audio_io import OUTPUT_RATE
from omniduplex.pipeline.events import ReplyDone, ReplyFailed, TurnEvent
from omniduplex.pipeline.messages import (
    AsrPiece,
    AudioOutput,
    DecoderOutput,
    Meta,
    PartialTranscript,
    Prefill,
    StageError,
    StageMessage,
    Transcript,
    TurnOptions,
    TurnRequest,
    UtteranceRequest,
)
from omniduplex.pipeline.text.detokenize import IncrementalDetokenizer
from omniduplex.pipeline.topology import Topology
from omniduplex.pipeline.turn_state import PartialCallback, TurnState

TTFP_SPLITS_KEPT = 256
"""How many turns' TTFP splits :attr:`Orchestrator.ttfp_splits` keeps."""

log = logging.getLogger("omniduplex.orchestrator")

OutputCallback = Callable[[StageMessage], None]
"""A message a stage of ``topology.to_orchestrator`` sent to the orchestrator (or a :class:`StageError` the
backend made for a failed request); the orchestrator reads it by its kind (:data:`Orchestrator._handlers`)."""


class Backend(Protocol):
    """Where the stages run. ``send`` enters a turn at the graph's entry; ``abort`` reaches every stage."""

    topo: Topology
    """The graph the backend routes by."""

    def start(self, on_output: OutputCallback) -> None: ...

    def send(self, msg: StageMessage) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def stop(self) -> None: ...



class Orchestrator:
    """Turn-level API over a backend.

    Args:
        backend: where the stages run.
        tokenizer: decodes the text stage's ids for reply-text events (``None`` when the stage sends its
            text deltas itself, as the cascade's LLM stage does).
        record: keep each turn's token ids and codec frames (``--dump-tokens``); costs memory per turn.
        output_rate: sample rate of the PCM the graph emits (Hz; :func:`.topology.output_rate`).
        side_transcript: the graph has a side ASR stage (:func:`.topology.with_side_asr`): a turn's
            ``done`` waits for its ``transcript`` event, which may come after the last audio.
    """

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer | None,
        record: bool = False,
        output_rate: int = OUTPUT_RATE,
        side_transcript: bool = False,
    ) -> None:
        self.backend, self.tok, self.record = backend, tokenizer, record
        self.output_rate, self.side_transcript = output_rate, side_transcript
        self.turns: dict[str, TurnState] = {}
        self.ttfp_splits: deque[dict[str, float]] = deque(maxlen=TTFP_SPLITS_KEPT)
        """The latest turns' TTFP and its split at their first audio (``ttfp_ms`` and
        :meth:`.turn_state.TurnState.split_ttfp`'s parts, ms), oldest first: what a benchmark reads, also of
        turns cancelled after their first audio."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self.live_asr = tuple(backend.topo.entry_stages) == ("asr",)
        """Whether :meth:`feed` works: the graph's one entry stage is the ASR (the cascade)."""

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.backend.start, self._on_output)

    async def stop(self) -> None:
        for rid in list(self.turns):
            self.cancel(rid)
        await asyncio.to_thread(self.backend.stop)

    def submit(
        self, waveform: np.ndarray, options: TurnOptions | None = None, request_id: str | None = None
    ) -> str:
        """Start a turn from 16 kHz mono float32 ``waveform`` with the turn's ``options`` (system prompt,
        history, sampling, tools, ...: :class:`~.messages.TurnOptions`); returns its request id.

        Raises:
            ValueError: the id is in use by a turn already submitted.
        """
        rid = request_id or f"turn-{next(self._ids)}"
        turn = self.turns.get(rid)
        if turn is not None and not turn.open:
            raise ValueError(f"turn {rid!r} is already running")
        if turn is None:
            turn = self.turns[rid] = self._new_turn(rid)
        else:  # fed while spoken: the turn starts now (TTFP counts from here); send the samples not fed
            turn.open, turn.t_submit = False, time.perf_counter()
            waveform = np.asarray(waveform)[turn.fed :]
        wav = torch.from_numpy(np.ascontiguousarray(waveform, dtype=np.float32))
        meta = TurnRequest(turn=options or TurnOptions())
        self._send(StageMessage(rid, {"waveform": wav}, meta, last=True))
        return rid

    def speak(
        self, utterance: UtteranceRequest, ref_audio: np.ndarray | None = None, request_id: str | None = None
    ) -> str:
        """Start an utterance on a text-to-speech graph (:data:`.topology.QWEN3_TTS`); returns its id.

        ``utterance``: the text and voice fields the talker stage reads (:mod:`.stages.qwen3_tts_talker`);
        ``ref_audio``: float32 ``[n]`` at 24 kHz for a cloned voice (travels as a tensor). Its events:
        ``audio`` pieces, then ``done`` (metrics as for a turn, with the TTFP split
        ``talker_first_frame_ms`` / ``codec_first_chunk_ms``) or ``error``.

        Raises:
            ValueError: the id is in use.
        """
        rid = request_id or f"speech-{next(self._ids)}"
        if rid in self.turns:
            raise ValueError(f"request {rid!r} is already running")
        tensors = {}
        if ref_audio is not None:
            ref = np.ascontiguousarray(ref_audio, dtype=np.float32).reshape(-1)
            tensors["ref_audio"] = torch.from_numpy(ref)
        self.turns[rid] = self._new_turn(rid)
        self._send(StageMessage(rid, tensors, utterance, last=True))
        return rid

    def feed(
        self,
        request_id: str,
        samples: np.ndarray,
        on_partial: PartialCallback | None = None,
        prefill: Prefill | None = None,
    ) -> None:
        """Send the next ``samples`` (16 kHz mono float32) of turn ``request_id``, still being spoken, to the
        ASR stage; ``on_partial`` (called on the event loop thread) gets its partial transcripts until
        :meth:`submit`. ``prefill`` (system prompt and history, with the first samples of a turn): the
        conversation the turn will be answered in; the LLM stage then prefills it with the partial
        transcripts while the user speaks (:mod:`omniduplex.pipeline.stages.llm`).
        ``submit(waveform, ...)`` then takes the whole turn's audio and sends only what was
        not fed (fed audio is taken to be its prefix); :meth:`cancel` drops a turn fed but not submitted.

        Raises:
            ValueError: the graph has no live ASR (:attr:`live_asr`), or the turn was already submitted.
        """
        if not self.live_asr:
            raise ValueError("this graph does not transcribe while the user speaks (its entry is not an ASR)")
        turn = self.turns.get(request_id)
        if turn is None:
            turn = self.turns[request_id] = self._new_turn(request_id)
            turn.open = True
        elif not turn.open:
            raise ValueError(f"turn {request_id!r} was already submitted")
        if on_partial is not None:
            turn.on_partial = on_partial
        wav = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32).reshape(-1))
        turn.fed += wav.numel()
        self._send(StageMessage(request_id, {"waveform": wav}, AsrPiece(prefill=prefill), last=False))

    def _send(self, msg: StageMessage) -> None:
        """Send ``msg`` to the graph's entry."""
        self.backend.send(msg)

    def _new_turn(self, rid: str) -> TurnState:
        return TurnState(
            rid,
            asyncio.Queue(),
            IncrementalDetokenizer(self.tok) if self.tok else None,
            transcript_pending=self.side_transcript,
        )

    async def events(self, request_id: str) -> AsyncIterator[TurnEvent]:
        """Events of a turn until ``done`` or ``error`` (the turn is then forgotten)."""
        turn = self.turns[request_id]
        try:
            while True:
                ev = await turn.queue.get()
                yield ev
                if isinstance(ev, ReplyDone | ReplyFailed):
                    return
        finally:
            self.turns.pop(request_id, None)

    def cancel(self, request_id: str) -> None:
        """Cancel a turn in every stage (frees its KV blocks and relay slots); no-op when unknown."""
        turn = self.turns.get(request_id)
        if turn is None or turn.finished:
            return
        turn.finished = True
        self.backend.abort(request_id)
        if turn.open:  # fed, never submitted: nobody reads its events
            self.turns.pop(request_id, None)
            return
        turn.queue.put_nowait(ReplyFailed("cancelled", request_id))

    def turn_record(self, request_id: str) -> dict[str, list]:
        """``prompt_token_ids``, ``text_token_ids`` (Thinker or unified LM text) and ``codes`` (one list of
        codebook ids per codec frame) of a turn: the same keys for both graph shapes."""
        turn = self.turns[request_id]
        return {
            "prompt_token_ids": turn.prompt_ids,
            "text_token_ids": turn.token_ids,
            "codes": turn.codes,
        }

    # -- called from the backend's thread ----------------------------------------------------------
    def _on_output(self, msg: StageMessage) -> None:
        self.loop.call_soon_threadsafe(self._handle, msg)

    def _handle(self, msg: StageMessage) -> None:
        """Dispatch one output of the graph by its declared kind (:data:`_handlers`)."""
        turn = self.turns.get(msg.request_id)
        if turn is None or turn.finished:
            return
        handler = self._handlers.get(type(msg.meta))
        if handler is None:
            return
        source = type(msg.meta).__name__
        try:
            handler(self, turn, msg)
        except Exception as e:  # an output this turn cannot be read from: the turn fails, the server goes on
            log.exception("%s: reading its %s output failed", msg.request_id, source)
            if not turn.finished:  # (its end was already queued otherwise)
                error = f"orchestrator: reading the {source} output failed: {type(e).__name__}: {e}"
                self._end_failed(turn, error, "orchestrator")

    def _on_error(self, turn: TurnState, msg: StageMessage) -> None:
        err = msg.meta
        assert isinstance(err, StageError)
        self._end_failed(turn, err.error or "pipeline error", err.stage)

    def _end_failed(self, turn: TurnState, error: str, stage: str | None) -> None:
        """End ``turn`` with :class:`ReplyFailed` (``stage``: the stage to blame) and abort it everywhere."""
        turn.finished = True
        self.backend.abort(turn.request_id)
        if turn.open:  # failed while fed: its submit will find no turn and start afresh
            self.turns.pop(turn.request_id, None)
            return
        turn.queue.put_nowait(ReplyFailed(error, turn.request_id, stage))

    def _on_decoder(self, turn: TurnState, msg: StageMessage) -> None:
        if "token" in msg.tensors:
            turn.read_text(msg)
        if self.record and "codes" in msg.tensors:
            turn.codes.append(msg.tensors["codes"].tolist())

    def _on_audio(self, turn: TurnState, msg: StageMessage) -> None:
        first = turn.t_first_audio is None
        turn.read_audio(msg, self.output_rate)
        if first and turn.t_first_audio is not None:
            self.ttfp_splits.append({"ttfp_ms": 1000 * (turn.t_first_audio - turn.t_submit), **turn.stage_ms})

    _handlers: dict[type[Meta], Callable[[Orchestrator, TurnState, StageMessage], None]] = {
        StageError: _on_error,
        PartialTranscript: lambda self, turn, msg: turn.read_partial(msg),
        Transcript: lambda self, turn, msg: turn.read_transcript(msg),
        DecoderOutput: _on_decoder,
        AudioOutput: _on_audio,
    }
    """Message kind → its handler."""
