"""Stage 0 of the cascade: a turn's speech → its transcript and word timings (Whisper, batched).

Input: ``waveform`` float32 ``[samples]`` at 16 kHz, one message per turn; meta is the turn's (system
prompt, history, options) and is passed through. Output: one message per turn, ``last=True``, no
tensors, meta = the input meta plus ``transcript`` (str, "" for silence or noise), ``words``
(``[[word, start_s, end_s], ...]``, seconds from the start of the turn's audio) and ``asr_ms`` (wall time of
the batch the turn ran in, ms). Every turn pending at a step goes in one
:meth:`~omniduplex.models.cascade.asr.WhisperASR.transcribe_batch` call (up to ``max_batch``).

A typed turn (meta ``user_text``, e.g. a Realtime ``conversation.item.create``) needs no transcription:
its text is the transcript, sent on at once with no ``words``, and its waveform may be empty.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from omniduplex.models.cascade.asr import SAMPLE_RATE, WhisperASR
from omniduplex.pipeline.messages import StageMessage

MIN_SAMPLES = SAMPLE_RATE // 10
"""Shortest turn accepted: 0.1 s at 16 kHz (1600 samples)."""


class ASRWorker:
    """Batches every pending turn of a step through one Whisper call.

    Args:
        asr: the loaded model.
        max_batch: most turns per step; the rest wait for the next step in arrival order.
    """

    def __init__(self, asr: WhisperASR, max_batch: int = 8) -> None:
        self.asr, self.max_batch = asr, max_batch
        self.pending: list[StageMessage] = []

    def submit(self, msg: StageMessage) -> None:
        """Queue a turn.

        Raises:
            ValueError: ``waveform`` missing, not a 1-D float tensor, or shorter than 0.1 s (this turn only).
        """
        if isinstance(msg.meta.get("user_text"), str):
            self.pending.append(msg)
            return
        wav = msg.tensors.get("waveform")
        if isinstance(wav, np.ndarray):
            wav = msg.tensors["waveform"] = torch.from_numpy(wav)
        if wav is None or wav.ndim != 1 or not wav.is_floating_point() or wav.numel() < MIN_SAMPLES:
            shape = None if wav is None else f"{list(wav.shape)} {wav.dtype}"
            raise ValueError(
                f"turn {msg.request_id}: need a 1-D float 16 kHz waveform of at least {MIN_SAMPLES} samples "
                f"(0.1 s), got {shape}"
            )
        self.pending.append(msg)

    def abort(self, request_id: str) -> None:
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[StageMessage]:
        """Transcribe up to ``max_batch`` pending turns together; one ``last`` message per turn."""
        typed = [m for m in self.pending if isinstance(m.meta.get("user_text"), str)]
        if typed:  # no model call: answer these at once, alone in their step
            self.pending = [m for m in self.pending if not isinstance(m.meta.get("user_text"), str)]
            return [
                StageMessage(
                    m.request_id, {}, {**m.meta, "transcript": m.meta["user_text"], "words": []}, last=True
                )
                for m in typed
            ]
        batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
        if not batch:
            return []
        waves = [_numpy(m.tensors["waveform"]) for m in batch]
        t0 = time.perf_counter()
        transcripts = self.asr.transcribe_batch(waves)
        asr_ms = 1000 * (time.perf_counter() - t0)
        return [
            StageMessage(
                m.request_id,
                {},
                {
                    **m.meta,
                    "transcript": t.text,
                    "words": [[w.word.strip(), w.start_s, w.end_s] for w in t.words],
                    "asr_ms": asr_ms,
                },
                last=True,
            )
            for m, t in zip(batch, transcripts)
        ]


def _numpy(wav: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(wav.detach().to("cpu", torch.float32).numpy())
