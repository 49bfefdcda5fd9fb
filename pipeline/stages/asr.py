"""Stage 0 of the cascade: a turn's speech → its transcript (and word timings with Whisper), batched.

Input: ``waveform`` float32 ``[samples]`` at 16 kHz, one message per turn; meta is the turn's (system
prompt, history, options) and is passed through. Output: one message per turn, ``last=True``, no
tensors, meta = the input meta plus ``transcript`` (str, "" for silence or noise), ``words``
(``[[word, start_s, end_s], ...]``, seconds from the start of the turn's audio) and ``asr_ms`` (wall time of
the batch the turn ran in, ms). Every turn pending at a step goes in one
:meth:`~omniduplex.models.cascade.asr.WhisperASR.transcribe_batch` call (up to ``max_batch``).

The model is :func:`~omniduplex.models.cascade.asr.load_asr`'s (Moonshine or Whisper); Moonshine gives
no word timings (``words`` is ``[]``).

Incremental transcription (optional): while the user still speaks, the caller may send the open turn's
audio in pieces: messages with meta ``asr_piece=True``, ``last=False`` and a ``waveform`` of the new samples
(any length). They feed a :class:`~omniduplex.models.cascade.streaming_asr.IncrementalTranscriber`: each
chunk closed at an in-turn pause is transcribed once, and the worker answers with ``last=False`` messages
whose meta holds ``partial_transcript`` (closed chunks + the open chunk's latest hypothesis) and
``stable_transcript`` (closed chunks only). The turn's usual message (no ``asr_piece``) then carries only
the samples not yet sent (possibly none) and is answered as above, decoding only the tail chunk;
``asr_ms`` is then the end-of-turn work only and ``asr_tail_s`` the audio it decoded (s). A piece whose meta
holds ``prefill`` (``{system_prompt, history}``, the conversation the turn will be answered in) makes the
turn's partials carry it too: they then also go downstream, where the LLM stage prefills the chat heard so far
(:mod:`.llm`, "prefill while the user speaks"). A partial leaves at the start of the next step, after the
stage has taken in what arrived during the decode: a turn that ended meanwhile (the pause hypothesis was
the end of turn) sends its transcript alone, and the LLM stage never starts a prefill of the same words
that the turn itself then waits behind (measured: 150 ms of SmolLM2 prefill on 2 busy cores).

The hypotheses cost a decode each, and one still running when the turn ends delays its transcript: they
run only while the model keeps up (running mean of the steps' decode time): the periodic ones while it is
at most :data:`HYPOTHESIS_BUDGET` of the period, the one asked when a pause begins (if the pause is the end
of turn, it covers all the sound and nothing is left to decode then) while it is at most
:data:`PAUSE_HYPOTHESIS_BUDGET_MS`. Whisper pads every decode to 30 s and is the slow case on a loaded
2-core CPU; Moonshine's cost follows the audio length. A model too slow for both gets its turns whole, as
without pieces (no partials).

Load-aware decoding: a beam-search model (Moonshine, beam 4) decodes greedily in a step that holds the audio
of several turns (``greedy_from``): the stage decodes them one after another, and at c = 4 the beam's ~2×
decode time would stand between each caller's end of speech and its reply. One caller keeps the beam.

A typed turn (meta ``user_text``, e.g. a Realtime ``conversation.item.create``) needs no transcription:
its text is the transcript, sent on at once with no ``words``, and its waveform may be empty.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from omniduplex.models.cascade.asr import SAMPLE_RATE
from omniduplex.models.cascade.streaming_asr import ChunkPolicy, IncrementalTranscriber
from omniduplex.pipeline.messages import (
    AsrPiece,
    PartialTranscript,
    Prefill,
    StageMessage,
    Transcript,
    TurnOptions,
)
from omniduplex.pipeline.stages.contract import BatchGauges

HYPOTHESIS_BUDGET = 0.5
"""Largest share of ``hypothesis_every_s`` a step's decode may take (running mean) for periodic hypotheses
to run: half the period leaves the other half to the rest of the pipeline and to the end of the turn."""

PAUSE_HYPOTHESIS_BUDGET_MS = 1000.0
"""Longest mean decode (ms) for the pause hypothesis: about what a decode may take and still be done, or
nearly, when the end of turn comes (500 ms endpointing after the 100 ms pause), so that a pause that was
not the end leaves no long stale decode in the way of the real end."""

MIN_SAMPLES = SAMPLE_RATE // 10
"""Shortest turn accepted: 0.1 s at 16 kHz (1600 samples)."""


class ASRWorker(BatchGauges):
    """Batches every pending turn of a step through one ``transcribe_batch`` call.

    Args:
        asr: the loaded model (``WhisperASR`` or ``MoonshineASR``: ``transcribe_batch(waves)`` → transcripts).
        max_batch: most turns per step; the rest wait for the next step in arrival order.
        policy: where open turns sent in pieces are cut (:class:`ChunkPolicy`).
        hypothesis_every_s: re-decode an open chunk after this much new audio for the partial transcript
            (``None``: partials carry closed chunks only).
        hypothesis_budget: :data:`HYPOTHESIS_BUDGET` (share of the period).
        pause_budget_ms: :data:`PAUSE_HYPOTHESIS_BUDGET_MS` (ms).
        greedy_from: a step that decodes the audio of this many turns or more asks a beam-search model
            (``transcribe_batch(waves, beam=1)``, :class:`~omniduplex.models.cascade.moonshine.MoonshineASR`)
            for greedy decoding: its turns decode one after another, so at c = 4 the beam's ~2× decode time
            would stand between each caller's end of speech and its reply (``None``: always the model's
            beam).
    """

    def __init__(
        self,
        asr,
        max_batch: int = 8,
        policy: ChunkPolicy | None = None,
        hypothesis_every_s: float | None = 0.4,
        hypothesis_budget: float = HYPOTHESIS_BUDGET,
        pause_budget_ms: float = PAUSE_HYPOTHESIS_BUDGET_MS,
        greedy_from: int | None = 2,
    ) -> None:
        self.asr, self.max_batch = asr, max_batch
        self.greedy_from = greedy_from if getattr(asr, "beam", 1) > 1 else None
        self.hypothesis_budget, self.pause_budget_ms = hypothesis_budget, pause_budget_ms
        self.pending: list[StageMessage] = []
        self.policy, self.hypothesis_every_s = policy or ChunkPolicy(), hypothesis_every_s
        self.streams: dict[str, IncrementalTranscriber] = {}  # open turns sent in pieces
        self.stream_turn: dict[str, TurnOptions | None] = {}  # the turn's options, from its last message
        self.prefill: dict[str, Prefill] = {}  # open turns' conversation context, for the LLM's prefill hints
        self.dirty: list[str] = []  # streams with new audio since their last step
        self.held: dict[str, StageMessage] = {}  # each stream's newest partial, sent at the next step
        self.stream_decode_ms = 0.0  # running mean of the steps' decode time (ms)
        self.greedy_steps = 0  # steps decoded greedily because several turns waited (greedy_from)

    def submit(self, msg: StageMessage) -> None:
        """Queue a turn.

        Raises:
            ValueError: ``waveform`` missing, not a 1-D float tensor, or shorter than 0.1 s (this turn only).
        """
        if msg.meta.options.user_text is not None:
            self.pending.append(msg)
            return
        wav = msg.tensors.get("waveform")
        if isinstance(wav, np.ndarray):
            wav = msg.tensors["waveform"] = torch.from_numpy(wav)
        rid = msg.request_id
        piece = isinstance(msg.meta, AsrPiece)
        if piece or rid in self.streams:
            if wav is not None and (wav.ndim != 1 or not wav.is_floating_point()):
                raise ValueError(
                    f"turn {rid}: audio piece must be a 1-D float 16 kHz waveform, got {wav.shape}"
                )
            stream = self.streams.get(rid)
            if stream is None:
                stream = self.streams[rid] = IncrementalTranscriber(self.policy, self.hypothesis_every_s)
            if isinstance(msg.meta, AsrPiece) and msg.meta.prefill is not None:
                self.prefill[rid] = msg.meta.prefill
            if wav is not None and wav.numel():
                stream.push(_numpy(wav))
            if not piece:  # the turn's end: its last samples came with it
                if stream.samples < MIN_SAMPLES:
                    self._drop(rid)
                    raise ValueError(
                        f"turn {rid}: need at least {MIN_SAMPLES} samples (0.1 s), got {stream.samples}"
                    )
                stream.finish()
                self.stream_turn[rid] = msg.meta.turn
            if rid not in self.dirty:
                self.dirty.append(rid)
            return
        if wav is None or wav.ndim != 1 or not wav.is_floating_point() or wav.numel() < MIN_SAMPLES:
            shape = None if wav is None else f"{list(wav.shape)} {wav.dtype}"
            raise ValueError(
                f"turn {msg.request_id}: need a 1-D float 16 kHz waveform of at least {MIN_SAMPLES} samples "
                f"(0.1 s), got {shape}"
            )
        self.pending.append(msg)

    def abort(self, request_id: str) -> None:
        self.pending = [m for m in self.pending if m.request_id != request_id]
        self._drop(request_id)

    def _drop(self, rid: str) -> None:
        self.streams.pop(rid, None)
        self.stream_turn.pop(rid, None)
        self.prefill.pop(rid, None)
        self.held.pop(rid, None)
        self.dirty = [r for r in self.dirty if r != rid]

    def has_work(self) -> bool:
        return bool(self.pending or self.dirty or self.held)

    def step(self) -> list[StageMessage]:
        """Transcribe up to ``max_batch`` pending turns together; one ``last`` message per turn."""
        typed = [m for m in self.pending if m.meta.options.user_text is not None]
        if typed:  # no model call: answer these at once, alone in their step
            self.pending = [m for m in self.pending if m.meta.options.user_text is None]
            return [
                StageMessage(
                    m.request_id,
                    {},
                    Transcript(turn=m.meta.turn, transcript=m.meta.options.user_text or ""),
                    last=True,
                )
                for m in typed
            ]
        held = [m for rid, m in self.held.items() if not self.streams[rid].finished]  # else superseded
        self.held = {}
        batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
        streamed, self.dirty = self.dirty[: self.max_batch], self.dirty[self.max_batch :]
        if not batch and not streamed:
            return held
        waves = [_numpy(m.tensors["waveform"]) for m in batch]
        periodic = self.hypothesis_every_s is not None and (
            self.stream_decode_ms <= self.hypothesis_budget * 1000 * self.hypothesis_every_s
        )
        pause = self.stream_decode_ms <= self.pause_budget_ms
        jobs = [self.streams[rid].jobs(periodic, pause) for rid in streamed]
        t0 = time.perf_counter()
        turns = len(waves) + sum(1 for j in jobs if j)
        extra = {"beam": 1} if self.greedy_from is not None and turns >= self.greedy_from else {}
        self.greedy_steps += bool(extra)
        results = (
            self.asr.transcribe_batch(waves + [w for j in jobs for w in j], **extra) if turns else []
        )
        asr_ms = 1000 * (time.perf_counter() - t0)
        if results:  # every decode counts: a model too slow for hypotheses must be seen to get faster
            self.stream_decode_ms = 0.7 * self.stream_decode_ms + 0.3 * asr_ms
        transcripts, at = results[: len(waves)], len(waves)
        out = held + self._stream_out(streamed, jobs, results, at, asr_ms)
        return out + [
            StageMessage(
                m.request_id,
                {},
                Transcript(
                    turn=m.meta.turn,
                    transcript=t.text,
                    words=[[w.word.strip(), w.start_s, w.end_s] for w in t.words],
                    asr_ms=asr_ms,
                ),
                last=True,
            )
            for m, t in zip(batch, transcripts)
        ]

    def _stream_out(self, streamed, jobs, results, at, asr_ms) -> list[StageMessage]:
        """Messages of the streamed turns of a step: the transcript of each finished one; a partial per
        open turn whose text changed is held for the next step (module docstring)."""
        out = []
        for rid, job in zip(streamed, jobs):
            stream = self.streams[rid]
            before = stream.partial().text
            partial = stream.take([t.text for t in results[at : at + len(job)]])
            at += len(job)
            if stream.done:
                turn = self.stream_turn[rid]
                self._drop(rid)
                out.append(
                    StageMessage(
                        rid,
                        {},
                        Transcript(
                            turn=turn,
                            transcript=stream.text,
                            asr_ms=asr_ms,
                            asr_tail_s=stream.final_samples / SAMPLE_RATE,
                        ),
                        last=True,
                    )
                )
            elif partial.text != before:
                meta = PartialTranscript(
                    partial_transcript=partial.text,
                    stable_transcript=partial.stable,
                    prefill=self.prefill.get(rid),
                )
                self.held[rid] = StageMessage(rid, {}, meta, last=False)
        return out


def _numpy(wav: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(wav.detach().to("cpu", torch.float32).numpy())
