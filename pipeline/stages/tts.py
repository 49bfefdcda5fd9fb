"""Stage 2 of the cascade: the LLM's streamed reply text → speech, clause by clause (Piper).

Input: one message per LLM token, meta ``text`` = the token's text delta (may be ""), ``last`` when the
reply's text is complete. The turn's first message may carry options in its meta; ``skipped`` is passed
through on every output message of the turn. A text-only turn (first meta ``spoken: false``, a
``/v1/chat/completions`` request) gets no audio: only its closing message.

Output, per clause (:class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`), one message per piece of its
audio (:meth:`~omniduplex.models.cascade.tts.PiperTTS.stream`: the turn's first clause starts with a short
piece, ~0.3 s, for time to first audio; later pieces are up to ~1.9 s, so most later clauses are one
piece): ``pcm`` float32 ``[n]`` at ``output_rate`` (Hz), meta ``text`` = the exact clause on the clause's
last piece and "" on the others, ``chunk`` = the clause's index in the turn (0, 1, ...) and ``tts_ms`` = the
piece's synthesis time (ms), ``last=False``; then one ``last=True`` message (``pcm`` possibly empty, meta
``text`` ""). The texts, in order, are the reply without whitespace and markup: every spoken character
belongs to exactly one message, the one ending the audio that speaks it, which is the alignment the
session uses to cut an interrupted reply back to what was played. Each turn resamples through its own
``soxr.ResampleStream``, so the concatenated chunks are one continuous waveform (equal to resampling the
turn's audio in one go); each chunk's samples lag its clause by the resampler's delay (~37 ms for soxr HQ
at 22.05 → 24 kHz), inside the silence VITS leaves around an utterance.

Scheduling: a step synthesises one piece, so its audio leaves as soon as it is made (a step's messages go
out when it returns: four first pieces in one step would hold the first caller's audio for all four).
Turns with no audio out yet go first, in arrival order (their first piece is their time to first audio; the
others have audio buffered at the client); otherwise the ready turns take turns (round robin), so a long
reply never holds back a new one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import soxr
import torch

from omniduplex.models.cascade.piper_stream import FIRST_PIECE_FRAMES, PIECE_FRAMES, Piece
from omniduplex.models.cascade.tts import PiperTTS
from omniduplex.pipeline.messages import AudioOutput, DecoderOutput, StageMessage
from omniduplex.pipeline.stages.contract import WorkerBase
from omniduplex.pipeline.stages.tts_intake import AbortedTurns, TextTurn, add_text_delta
from omniduplex.pipeline.text.clauses import ClauseSplitter


@dataclass(kw_only=True)
class _Turn(TextTurn):
    resampler: soxr.ResampleStream | None  # None when the voice already speaks at the output rate
    speaking: tuple[str, Iterator[Piece]] | None = None  # the clause being spoken, and its pieces to come
    started: bool = False  # some audio has gone out
    ready_at: float | None = None  # when the oldest clause not yet spoken became ready (perf_counter s)


class TTSWorker(WorkerBase):
    """Streaming synthesis of every reply in flight.

    Args:
        tts: the Piper voice.
        output_rate: rate of the emitted ``pcm`` (Hz; the cascade's 24000).
        first_max_words, min_words: clause sizes (:class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`).
    """

    def __init__(
        self, tts: PiperTTS, output_rate: int = 24_000, first_max_words: int = 6, min_words: int = 3
    ) -> None:
        self.tts, self.output_rate = tts, output_rate
        self.first_max_words, self.min_words = first_max_words, min_words
        self.turns: dict[str, _Turn] = {}
        self._aborted = AbortedTurns()  # late messages of aborted turns are dropped

    def submit(self, msg: StageMessage) -> None:
        """Add a text delta (a :class:`~omniduplex.pipeline.messages.DecoderOutput`'s ``text``) to its turn;
        ``last`` closes the turn's text.

        Raises:
            ValueError: not a ``DecoderOutput`` (this turn only).
        """
        add_text_delta(msg, self._aborted, self.turns, self._new_turn)
        t = self.turns.get(msg.request_id)
        if t is not None and t.clauses and t.ready_at is None:
            t.ready_at = time.perf_counter()

    def stats(self) -> dict[str, int]:
        """``batch_size``: the turns open (each step speaks a clause of those ready, round robin)."""
        return {"queue_depth": 0, "batch_size": len(self.turns)}

    def abort(self, request_id: str) -> None:
        """Drop the turn at once: nothing more of it is emitted, even if text for it still arrives."""
        self.turns.pop(request_id, None)
        self._aborted.add(request_id)

    def has_work(self) -> bool:
        return any(t.clauses or t.speaking or t.finished for t in self.turns.values())

    def step(self) -> list[StageMessage]:
        """One piece: the oldest turn with no audio out yet, else the next ready turn in round robin; plus
        the ``last`` message of every turn whose text is all spoken (a turn's follows its final piece)."""
        ready = [rid for rid, t in self.turns.items() if t.clauses or t.speaking]
        first = [rid for rid in ready if not self.turns[rid].started]
        outs: list[StageMessage] = []
        if ready:
            rid = (first or ready)[0]
            outs.append(self._speak(rid, self.turns[rid]))
            self.turns[rid] = self.turns.pop(rid)  # to the back of the round robin
        for rid, t in list(self.turns.items()):
            if t.finished and not t.clauses and not t.speaking:
                end = AudioOutput(text="", skipped=t.skipped)
                outs.append(StageMessage(rid, {"pcm": self._flush(t)}, end, last=True))
                del self.turns[rid]
        return outs

    def _speak(self, rid: str, t: _Turn) -> StageMessage:
        t0 = time.perf_counter()
        wait_ms = None
        if t.speaking is None:
            text = t.clauses.popleft()
            wait_ms = 1000 * (t0 - t.ready_at) if t.ready_at is not None else None
            t.ready_at = t0 if t.clauses else None
            t.speaking = text, self.tts.stream(text, FIRST_PIECE_FRAMES if t.chunk == 0 else PIECE_FRAMES)
        text, pieces = t.speaking
        piece = next(pieces)
        pcm = self._resample(t, piece.pcm, last=False)
        if piece.last:
            t.speaking = None
            if t.finished and not t.clauses:  # the turn's final piece keeps the resampler's tail
                pcm = torch.cat([pcm, self._flush(t)])
        tts_ms = 1000 * (time.perf_counter() - t0)
        said = text if piece.last else ""
        meta = AudioOutput(text=said, chunk=t.chunk, tts_ms=tts_ms, tts_wait_ms=wait_ms, skipped=t.skipped)
        t.chunk += piece.last
        t.started = t.started or pcm.numel() > 0
        return StageMessage(rid, {"pcm": pcm}, meta, last=False)

    def _new_turn(self, meta: DecoderOutput) -> _Turn:
        rate = self.tts.sample_rate
        resampler = None
        if rate != self.output_rate:
            resampler = soxr.ResampleStream(rate, self.output_rate, 1, dtype="float32", quality="HQ")
        return _Turn(
            ClauseSplitter(self.first_max_words, self.min_words),
            meta.skipped,
            resampler=resampler,
            silent=meta.options.spoken is False,
        )

    @staticmethod
    def _resample(t: _Turn, pcm: np.ndarray, last: bool) -> torch.Tensor:
        if t.resampler is not None:
            pcm = t.resampler.resample_chunk(np.ascontiguousarray(pcm, dtype=np.float32), last=last)
        return torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32))

    def _flush(self, t: _Turn) -> torch.Tensor:
        """The resampler's remaining samples (once per turn)."""
        if t.resampler is None:
            return torch.zeros(0)
        pcm = self._resample(t, np.zeros(0, np.float32), last=True)
        t.resampler = None
        return pcm
