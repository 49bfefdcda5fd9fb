"""The orchestrator: submit a turn, get an async stream of events, cancel it anywhere in the graph.

It speaks to a :class:`Backend` (stages in this process, or stage processes joined by the relay) and
turns the ASR stage's transcript into a ``transcript`` event (the user's words), the text stage's tokens
(Thinker, unified LM, cascade LLM) into reply-text deltas and the last stage's PCM (Code2Wav, DAC, Piper)
into audio chunks, measuring TTFP (turn submitted → first PCM chunk), E2EL, RTF and, for the cascade, the
per-stage split of TTFP on the way.

Live transcription (cascade graphs, whose one entry stage is the ASR): :meth:`Orchestrator.feed` sends the
audio of a turn still being spoken to the ASR stage in pieces; its partial transcripts go to the turn's
``on_partial`` callback, and :meth:`Orchestrator.submit` then sends only the samples not fed yet, so at end
of turn the ASR decodes only the tail (see :mod:`.stages.asr`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from tokenizers import Tokenizer

from omniduplex.pipeline.audio_io import OUTPUT_RATE
from omniduplex.pipeline.detokenize import IncrementalDetokenizer
from omniduplex.pipeline.edge_messages import (
    CHECK,
    AudioOutput,
    DecoderOutput,
    PartialTranscript,
    StageError,
    Transcript,
    check_message,
    parse,
)
from omniduplex.pipeline.events import (
    CallArgumentsDelta,
    CallDone,
    CallEvent,
    CallFailed,
    CallStarted,
    ReplyAudioChunk,
    ReplyDone,
    ReplyFailed,
    ReplyTextDelta,
    TurnEvent,
    UserTranscript,
)
from omniduplex.pipeline.messages import StageMessage, is_partial_transcript
from omniduplex.pipeline.topology import Topology

PartialCallback = Callable[[str, str], None]
"""``(text, stable)``: the partial transcript of a turn still being spoken (``text``: all heard so far, the
open chunk's latest hypothesis included; ``stable``: the prefix that will not change)."""

OutputCallback = Callable[[str, StageMessage], None]
"""``(source, message)``: source is ``"transcript"`` (meta ``transcript``, ``words``: the ASR stage),
``"text"`` (tensor ``token``, maybe ``prompt_ids``; meta ``text`` when the stage detokenizes itself),
``"partial"`` (meta ``partial_transcript``, ``stable_transcript``: the ASR stage on a turn still
being spoken), ``"codes"`` (a codec frame ``codes``), ``"audio"`` (``pcm``, meta ``text`` = the words it
speaks when the stage knows them; ``last`` ends the turn) or ``"error"`` (meta ``error``)."""


def output_sources(stage: str, msg: StageMessage, topo: Topology) -> list[str]:
    """The :data:`OutputCallback` sources a message of ``stage`` reports to the orchestrator as."""
    if stage not in topo.to_orchestrator:
        return []
    if stage == topo.audio_stage:
        return ["audio"]
    if stage == "asr" and is_partial_transcript(msg):
        return ["partial"]
    out = ["transcript"] if stage == "asr" and "transcript" in msg.meta else []
    return out + [k for t, k in (("token", "text"), ("codes", "codes")) if t in msg.tensors]


class Backend(Protocol):
    """Where the stages run. ``send`` enters a turn at the graph's entry; ``abort`` reaches every stage."""

    topo: Topology
    """The graph the backend routes by."""

    def start(self, on_output: OutputCallback) -> None: ...

    def send(self, msg: StageMessage) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def stop(self) -> None: ...


@dataclass
class _Turn:
    request_id: str
    queue: asyncio.Queue
    detok: IncrementalDetokenizer | None
    t_submit: float = field(default_factory=time.perf_counter)
    t_transcript: float | None = None
    t_first_audio: float | None = None
    stage_ms: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    codes: list[list[int]] = field(default_factory=list)
    finished: bool = False
    transcript_pending: bool = False  # a side ASR's transcript has not arrived yet
    done_metrics: dict | None = None  # the audio ended; ``done`` waits for the transcript
    open: bool = False  # fed in pieces (:meth:`Orchestrator.feed`), not submitted yet
    fed: int = 0  # samples fed before submit
    on_partial: PartialCallback | None = None


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
        self.turns: dict[str, _Turn] = {}
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

    def submit(self, waveform: np.ndarray, meta: dict | None = None, request_id: str | None = None) -> str:
        """Start a turn from 16 kHz mono float32 ``waveform``; returns its request id.

        ``meta``: ``system_prompt``, ``history`` (list of ``[role, text]``), ``sampling`` /
        ``talker_sampling`` (dicts of sampling parameters), ``speaker``; for unified checkpoints
        ``user_text``, ``max_text_tokens``, ``max_audio_frames``, ``cfg_scale``; for the cascade
        ``system_prompt``, ``history`` and ``sampling`` (the LLM's).
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
        self._send(StageMessage(rid, {"waveform": wav}, dict(meta or {}), last=True))
        return rid

    def speak(self, text: str, meta: dict | None = None, request_id: str | None = None) -> str:
        """Start an utterance on a text-to-speech graph (:data:`.topology.QWEN3_TTS`); returns its id.

        ``meta``: the voice fields of :mod:`.stages.qwen3_tts_talker` (``voice``, ``instructions``,
        ``language``, ``ref_text``, ``sampling``); a ``ref_audio`` float32 ``[n]`` 24 kHz array in it
        travels as a tensor. Its events: ``audio`` pieces, then ``done`` (metrics as for a turn, with the
        TTFP split ``talker_first_frame_ms`` / ``codec_first_chunk_ms``) or ``error``.

        Raises:
            ValueError: the id is in use.
        """
        rid = request_id or f"speech-{next(self._ids)}"
        if rid in self.turns:
            raise ValueError(f"request {rid!r} is already running")
        meta = dict(meta or {})
        tensors = {}
        if meta.get("ref_audio") is not None:
            ref = np.ascontiguousarray(meta.pop("ref_audio"), dtype=np.float32).reshape(-1)
            tensors["ref_audio"] = torch.from_numpy(ref)
        meta.pop("ref_audio", None)
        self.turns[rid] = self._new_turn(rid)
        self._send(StageMessage(rid, tensors, {**meta, "text": text}, last=True))
        return rid

    def feed(
        self,
        request_id: str,
        samples: np.ndarray,
        on_partial: PartialCallback | None = None,
        prefill: dict | None = None,
    ) -> None:
        """Send the next ``samples`` (16 kHz mono float32) of turn ``request_id``, still being spoken, to the
        ASR stage; ``on_partial`` (called on the event loop thread) gets its partial transcripts until
        :meth:`submit`. ``prefill`` (``{system_prompt, history}``, with the first samples of a turn): the
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
        meta: dict = {"asr_piece": True}
        if prefill is not None:
            meta["prefill"] = prefill
        self._send(StageMessage(request_id, {"waveform": wav}, meta, last=False))

    def _send(self, msg: StageMessage) -> None:
        """Send ``msg`` to the graph's entry (checked against its kind first in debug mode: raises
        :class:`~.edge_messages.EdgeMessageError`)."""
        if CHECK:
            check_message("orchestrator", msg)
        self.backend.send(msg)

    def _new_turn(self, rid: str) -> _Turn:
        return _Turn(
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
    def _on_output(self, source: str, msg: StageMessage) -> None:
        self.loop.call_soon_threadsafe(self._handle, source, msg)

    def _handle(self, source: str, msg: StageMessage) -> None:
        """Dispatch one output of the graph by its source (:data:`OutputCallback`) to its handler, which
        reads the message as its kind (:mod:`.edge_messages`)."""
        turn = self.turns.get(msg.request_id)
        if turn is None or turn.finished:
            return
        handler = self._handlers.get(source)
        if handler is not None:
            handler(self, turn, msg)

    def _on_error(self, turn: _Turn, msg: StageMessage) -> None:
        err = parse(StageError, msg)
        turn.finished = True
        self.backend.abort(turn.request_id)
        if turn.open:  # failed while fed: its submit will find no turn and start afresh
            self.turns.pop(turn.request_id, None)
            return
        turn.queue.put_nowait(ReplyFailed(str(err.error) or "pipeline error", turn.request_id))

    def _on_partial(self, turn: _Turn, msg: StageMessage) -> None:
        if turn.open and turn.on_partial is not None:
            p = parse(PartialTranscript, msg)
            turn.on_partial(str(p.partial_transcript), str(p.stable_transcript))

    def _on_transcript(self, turn: _Turn, msg: StageMessage) -> None:
        t = parse(Transcript, msg)
        turn.t_transcript = time.perf_counter()
        turn.transcript_pending = False
        turn.stage_ms["asr_wall_ms"] = 1000 * (turn.t_transcript - turn.t_submit)
        if t.asr_ms is not None:
            turn.stage_ms["asr_ms"] = float(t.asr_ms)
        if t.asr_tail_s is not None:  # fed while spoken: the audio left to decode at end of turn
            turn.stage_ms["asr_tail_s"] = float(t.asr_tail_s)
        turn.queue.put_nowait(UserTranscript(str(t.transcript), list(t.words), turn.request_id))
        if turn.done_metrics is not None:
            turn.finished = True
            turn.queue.put_nowait(ReplyDone(turn.done_metrics, turn.request_id))

    def _on_text(self, turn: _Turn, msg: StageMessage) -> None:
        out = parse(DecoderOutput, msg)
        if "prompt_ids" in msg.tensors:
            turn.prompt_ids = msg.tensors["prompt_ids"].tolist()
        ids = msg.tensors["token"].tolist()
        turn.token_ids += ids
        for call in _call_events(out, turn.request_id):  # a call's events, before the same message's text
            turn.queue.put_nowait(call)
        delta = out.text if out.text is not None else turn.detok.push_many(ids, final=msg.last)
        if delta:
            turn.queue.put_nowait(ReplyTextDelta(delta, turn.request_id))

    def _on_codes(self, turn: _Turn, msg: StageMessage) -> None:
        if self.record:
            turn.codes.append(msg.tensors["codes"].tolist())

    def _on_audio(self, turn: _Turn, msg: StageMessage) -> None:
        out = parse(AudioOutput, msg)
        pcm = msg.tensors.get("pcm")
        if pcm is not None and pcm.numel():
            if turn.t_first_audio is None:
                turn.t_first_audio = time.perf_counter()
                self._split_ttfp(turn, out)
            turn.samples += pcm.numel()
            turn.queue.put_nowait(ReplyAudioChunk(pcm.cpu().numpy(), str(out.text or ""), turn.request_id))
        if msg.last:
            now = time.perf_counter()
            audio_s = turn.samples / self.output_rate
            e2el = now - turn.t_submit
            metrics = {
                "ttfp_ms": 1000 * ((turn.t_first_audio or now) - turn.t_submit),
                "e2el_ms": 1000 * e2el,
                "audio_s": audio_s,
                "rtf": e2el / audio_s if audio_s else float("inf"),
                "prompt_tokens": len(turn.prompt_ids or ()),
                "completion_tokens": len(turn.token_ids),
                **turn.stage_ms,
            }
            if turn.transcript_pending:
                turn.done_metrics = metrics
                return
            turn.finished = True
            turn.queue.put_nowait(ReplyDone(metrics, turn.request_id))

    _handlers: dict[str, Callable[[Orchestrator, _Turn, StageMessage], None]] = {
        "error": _on_error,
        "partial": _on_partial,
        "transcript": _on_transcript,
        "text": _on_text,
        "codes": _on_codes,
        "audio": _on_audio,
    }
    """:data:`OutputCallback` source → its handler."""

    @staticmethod
    def _split_ttfp(turn: _Turn, out: AudioOutput) -> None:
        """TTFP split (ms). Qwen3-TTS graph: ``talker_first_frame_ms`` (the talker stage: admission → first
        frame) and ``codec_first_chunk_ms`` (the decode call of the first piece); the rest is relay hops and
        queueing. Cascade: ``asr_ms`` (the ASR stage's compute; ``asr_wall_ms``: submit → transcript,
        waits and relay hops included), ``tts_first_chunk_ms`` (synthesis of
        the first clause) and ``llm_first_clause_ms`` (transcript out → first clause audio, less that
        synthesis: the LLM's prefill and the tokens of its first clause, plus relay hops)."""
        if out.talker_ms is not None:  # Qwen3-TTS graph: the talker's first frame, then its 1-frame decode
            turn.stage_ms["talker_first_frame_ms"] = float(out.talker_ms)
            turn.stage_ms["codec_first_chunk_ms"] = float(out.codec_ms or 0.0)
        if out.tts_ms is None or turn.t_transcript is None:
            return
        tts = float(out.tts_ms)
        turn.stage_ms["tts_first_chunk_ms"] = tts
        turn.stage_ms["llm_first_clause_ms"] = max(0.0, 1000 * (turn.t_first_audio - turn.t_transcript) - tts)


def _call_events(out: DecoderOutput, request_id: str) -> list[CallEvent]:
    """The function-call events of one LLM message, in the order :data:`.stages.tool_calls.EVENT_KEYS`."""
    calls: list[CallEvent] = []
    if (e := out.tool_call_started) is not None:
        calls.append(CallStarted(e.call_id, e.name, e.index, request_id))
    if (e := out.tool_call_arguments_delta) is not None:
        calls.append(CallArgumentsDelta(e.call_id, e.delta, request_id))
    if (e := out.tool_call_done) is not None:
        calls.append(CallDone(e.call_id, e.name, e.arguments, request_id))
    if (e := out.tool_call_failed) is not None:
        calls.append(CallFailed(e.call_id, e.name, e.error, request_id))
    return calls
