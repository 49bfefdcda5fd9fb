"""One turn's state in the orchestrator, and how the graph's outputs for it become its events.

:class:`TurnState` holds a turn's queue of :mod:`.events` and its timings; its ``read_*`` methods read one
output of the graph (its typed meta, :mod:`.messages`) and put the events it means on the queue, measuring
TTFP, E2EL, RTF and, for the cascade, the per-stage split of TTFP (:meth:`TurnState.split_ttfp`). The
:class:`~.orchestrator.Orchestrator` dispatches each output to them by its kind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from omniduplex.pipeline.events import ReplyAudioChunk, ReplyDone, ReplyTextDelta, UserTranscript
from omniduplex.pipeline.messages import (
    AudioOutput,
    DecoderOutput,
    PartialTranscript,
    StageMessage,
    Transcript,
)
from omniduplex.pipeline.text.detokenize import IncrementalDetokenizer

PartialCallback = Callable[[str, str], None]
"""``(text, stable)``: the partial transcript of a turn still being spoken (``text``: all heard so far, the
open chunk's latest hypothesis included; ``stable``: the prefix that will not change)."""


@dataclass
class TurnState:
    """One turn (or utterance) in flight: its event queue, timings (``time.perf_counter`` seconds), ids."""

    request_id: str
    queue: asyncio.Queue
    detok: IncrementalDetokenizer | None
    t_submit: float = field(default_factory=time.perf_counter)
    t_transcript: float | None = None
    t_first_text: float | None = None
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

    def read_partial(self, msg: StageMessage) -> None:
        """A ``partial`` output: to ``on_partial`` while the turn is fed, not submitted."""
        if self.open and self.on_partial is not None:
            p = msg.meta
            assert isinstance(p, PartialTranscript)
            self.on_partial(p.partial_transcript, p.stable_transcript)

    def read_transcript(self, msg: StageMessage) -> None:
        """A ``transcript`` output: a :class:`UserTranscript` event (then ``done`` if the audio had ended)."""
        t = msg.meta
        assert isinstance(t, Transcript)
        self.t_transcript = time.perf_counter()
        self.transcript_pending = False
        self.stage_ms["asr_wall_ms"] = 1000 * (self.t_transcript - self.t_submit)
        if t.asr_ms is not None:
            self.stage_ms["asr_ms"] = t.asr_ms
        if t.asr_tail_s is not None:  # fed while spoken: the audio left to decode at end of turn
            self.stage_ms["asr_tail_s"] = t.asr_tail_s
        self.queue.put_nowait(UserTranscript(t.transcript, list(t.words), self.request_id))
        if self.done_metrics is not None:
            self.finished = True
            self.queue.put_nowait(ReplyDone(self.done_metrics, self.request_id))

    def read_text(self, msg: StageMessage) -> None:
        """A ``text`` output: its function-call events, then its reply-text delta."""
        out = msg.meta
        assert isinstance(out, DecoderOutput)
        if "prompt_ids" in msg.tensors:
            self.prompt_ids = msg.tensors["prompt_ids"].tolist()
        ids = msg.tensors["token"].tolist()
        self.token_ids += ids
        if ids and self.t_first_text is None:
            self.t_first_text = time.perf_counter()
            if self.t_transcript is not None:
                self.stage_ms["llm_first_token_ms"] = 1000 * (self.t_first_text - self.t_transcript)
        for call in out.calls:  # a call's events, as the LLM stage made them, before the message's text
            self.queue.put_nowait(replace(call, request_id=self.request_id))
        delta = out.text if out.text is not None else self.detok.push_many(ids, final=msg.last)
        if delta:
            self.queue.put_nowait(ReplyTextDelta(delta, self.request_id))

    def read_audio(self, msg: StageMessage, output_rate: int) -> None:
        """An ``audio`` output (PCM at ``output_rate`` Hz): an audio chunk; the last one ends the turn
        (``done`` with its metrics, held while a side ASR's transcript is pending)."""
        out = msg.meta
        assert isinstance(out, AudioOutput)
        pcm = msg.tensors.get("pcm")
        if pcm is not None and pcm.numel():
            if self.t_first_audio is None:
                self.t_first_audio = time.perf_counter()
                self.split_ttfp(out)
            self.samples += pcm.numel()
            self.queue.put_nowait(ReplyAudioChunk(pcm.cpu().numpy(), out.text or "", self.request_id))
        if msg.last:
            now = time.perf_counter()
            audio_s = self.samples / output_rate
            e2el = now - self.t_submit
            metrics = {
                "ttfp_ms": 1000 * ((self.t_first_audio or now) - self.t_submit),
                "e2el_ms": 1000 * e2el,
                "audio_s": audio_s,
                "rtf": e2el / audio_s if audio_s else float("inf"),
                "prompt_tokens": len(self.prompt_ids or ()),
                "completion_tokens": len(self.token_ids),
                **self.stage_ms,
            }
            if self.transcript_pending:
                self.done_metrics = metrics
                return
            self.finished = True
            self.queue.put_nowait(ReplyDone(metrics, self.request_id))

    def split_ttfp(self, out: AudioOutput) -> None:
        """TTFP split (ms). Qwen3-TTS graph: ``talker_first_frame_ms`` (the talker stage: admission → first
        frame) and ``codec_first_chunk_ms`` (the decode call of the first piece); the rest is relay hops and
        queueing. Qwen3-Omni the same two (the Talker from the Thinker's first token) and ``codec_wait_ms``
        (the first frame at the Code2Wav stage → its first chunk decoded: the chunk handoff).
        Cascade: ``asr_ms`` (the ASR stage's compute; ``asr_wall_ms``: submit → transcript, waits and relay
        hops included), ``llm_first_token_ms`` (transcript → the LLM's first reply token here: its prefill
        and first step, relay hops included), ``tts_first_chunk_ms`` (synthesis of the first clause),
        ``tts_wait_ms`` (the first clause's wait in the TTS stage behind other turns' pieces) and
        ``llm_first_clause_ms`` (transcript out → first clause audio, less that synthesis and that wait: the
        LLM's prefill and the tokens of its first clause, plus relay hops)."""
        if out.talker_ms is not None:  # Qwen3-TTS / -Omni graph: the talker's first frame, then its decode
            self.stage_ms["talker_first_frame_ms"] = out.talker_ms
            self.stage_ms["codec_first_chunk_ms"] = out.codec_ms or 0.0
        if out.codec_wait_ms is not None:
            self.stage_ms["codec_wait_ms"] = out.codec_wait_ms
        if out.tts_ms is None or self.t_transcript is None:
            return
        tts, wait = out.tts_ms, out.tts_wait_ms or 0.0
        self.stage_ms["tts_first_chunk_ms"] = tts
        if out.tts_wait_ms is not None:
            self.stage_ms["tts_wait_ms"] = wait
        self.stage_ms["llm_first_clause_ms"] = max(
            0.0, 1000 * (self.t_first_audio - self.t_transcript) - tts - wait
        )
