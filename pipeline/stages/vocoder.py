"""The vocoder stage of both graphs: codec frames → waveform, streamed with per-layer decoder state.

Qwen3-Omni runs Code2Wav (:class:`~omniduplex.models.qwen3_omni.code2wav_stream.Code2WavStream`, 24 kHz), the
unified LM the DAC decoder (:class:`~omniduplex.models.codecs.dac_stream.DacDecodeStream`, the codec's rate).
Each turn keeps one stream, so every frame is decoded once and the concatenated output equals the
one-shot decode of the turn's frames.

Input: ``codes`` int64 ``[G]`` per frame, ``last`` when the turn's frames are complete.
Output: ``pcm`` float32 ``[n]``, every sample no later frame can change; ``last`` on the turn's final
message (possibly empty); the first audio's meta carries the TTFP split: ``talker_ms`` (from the first
frame's meta), ``codec_ms`` (its forward) and ``codec_wait_ms`` (first frame in → first audio out, ms).
Frames are pushed in groups of ``initial_codec_chunk_frames`` until the first
samples come out (at once for causal Code2Wav; after ~9 frames of look-ahead for DAC's centred convs),
then of ``codec_chunk_frames``; on ``last`` whatever is pending. A push takes whole chunks (a multiple of
the chunk size, the rest waits): turns at different frames then push equal lengths and share one batched
forward (Code2Wav, ``push_batch``), whose CUDA graphs are captured at those sizes. A step is one forward:
the stage reads its input edge between forwards, so a turn's first frames wait for one forward at most
before theirs (first chunks go first), not for every turn's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from omniduplex.pipeline.config import ChunkingConfig
from omniduplex.pipeline.messages import AudioOutput, StageMessage
from omniduplex.pipeline.stages.contract import StreamGauges


class VocoderStream(Protocol):
    """``push(codes [1, G, n]) → [1, 1, m]`` samples now final; ``flush() → [1, 1, k]`` the rest."""

    def push(self, codes: torch.Tensor) -> torch.Tensor: ...

    def flush(self) -> torch.Tensor: ...


@dataclass
class _Turn:
    decoder: VocoderStream
    pending: list[torch.Tensor] = field(default_factory=list)  # frames not pushed yet, each int64 [G]
    finished: bool = False
    started: bool = False  # some audio has gone out
    first_frame_at: float | None = None  # perf_counter when its first frame arrived
    waiting_since: float = float("inf")  # perf_counter when its oldest pending frame arrived
    talker_ms: float | None = None  # the talker's first-frame time, passed on with the first audio


class VocoderWorker(StreamGauges):
    """Streaming decode of every turn in flight.

    Args:
        new_stream: makes one turn's decoder stream (e.g. ``lambda: Code2WavStream(model)``).
        chunking: push cadence (``initial_codec_chunk_frames``, ``codec_chunk_frames``).
        graphs: replays pushes as CUDA graphs where it can (``push_rows(streams, codes [B, G, n]) ->
            samples [B, 1, m] | None``, :class:`~.code2wav_graphs.Code2WavGraphs`); ``None`` pushes eagerly.
        push_batch: decodes several turns' chunks of the same length in one forward
            (``push_batch(streams, codes [B, G, n]) -> [B, 1, m]``, each row equal to its stream pushed
            alone: :func:`~omniduplex.models.qwen3_omni.code2wav_batch.push_together`); ``None``: one
            forward per turn.
        batch_key: streams with equal keys may share a forward (``stack_key``); default: all.
        max_batch: most turns in one forward (the stage's ``max_num_seqs``; 1 = one forward per turn).

    Raises ValueError: ``max_batch < 1``.
    """

    def __init__(
        self,
        new_stream: Callable[[], VocoderStream],
        chunking: ChunkingConfig | None = None,
        graphs=None,
        push_batch: Callable | None = None,
        batch_key: Callable | None = None,
        max_batch: int = 1,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.new_stream, self.cfg, self.graphs = new_stream, chunking or ChunkingConfig(), graphs
        self.push_batch, self.batch_key = push_batch, batch_key or (lambda stream: ())
        self.max_batch = max_batch if push_batch is not None else 1
        self.streams: dict[str, _Turn] = {}
        self.steps = self.forwards = self.rows = 0  # steps that pushed, decoder forwards, turn-rows pushed
        self.last_step_forwards = 0
        self.errors: list[tuple[str, str]] = []

    def submit(self, msg: StageMessage) -> None:
        """Raises ValueError on a frame of the wrong shape (this turn only)."""
        codes = msg.tensors.get("codes")
        if codes is not None and codes.dim() != 1:
            raise ValueError(f"turn {msg.request_id}: codes must be [G], got {list(codes.shape)}")
        t = self.streams.get(msg.request_id)
        if t is None:
            t = self.streams[msg.request_id] = _Turn(self.new_stream())
        if codes is not None:
            if not t.pending:
                t.waiting_since = time.perf_counter()
            t.pending.append(codes.to(torch.int64))
            if t.first_frame_at is None:
                t.first_frame_at = time.perf_counter()
                t.talker_ms = getattr(msg.meta, "talker_ms", None)
        t.finished = t.finished or msg.last

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    def pop_errors(self) -> list[tuple[str, str]]:
        """Turns whose frames the decoder refused (``ValueError``: ids outside the codebook); each was
        dropped, the others of its forward decoded alone."""
        errors, self.errors = self.errors, []
        return errors

    def stats(self) -> dict[str, int]:
        """Open streams (``batch_size``); so far: ``codec_steps`` (steps that pushed frames),
        ``codec_forwards`` (decoder forwards: batched pushes count once), ``codec_rows`` (turn chunks they
        decoded); ``codec_forwards_last_step``; ``cuda_graph_hits`` / ``cuda_graph_misses`` of the
        forwards when it has CUDA graphs."""
        return {
            **super().stats(),
            "codec_steps": self.steps,
            "codec_forwards": self.forwards,
            "codec_rows": self.rows,
            "codec_forwards_last_step": self.last_step_forwards,
            **({} if self.graphs is None else self.graphs.stats()),
        }

    def _need(self, t: _Turn) -> int:
        return self.cfg.codec_chunk_frames if t.started else self.cfg.initial_codec_chunk_frames

    def _ready(self, t: _Turn) -> bool:
        return t.finished or len(t.pending) >= self._need(t)

    def has_work(self) -> bool:
        return any(self._ready(t) for t in self.streams.values())

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        """One decoder forward, so the stage reads its input edge between forwards (a frame that arrives
        during a step waits for one forward, not for every turn's); one message per turn it pushed or that
        ended.

        The forward serves the turn whose oldest pending frame came first, with the other ready turns that
        have the same number of frames due (and equal ``batch_key``), oldest first, ``max_batch`` rows at
        most. Turns with no audio out yet go first (batched among themselves): their first packet (TTFP)
        does not wait behind the steady chunks of the other turns, which have audio buffered at the client.
        """
        ready = [(rid, t) for rid, t in self.streams.items() if self._ready(t)]
        first = [(rid, t) for rid, t in ready if not t.started]
        turns = sorted(first or ready, key=lambda rt: rt[1].waiting_since)
        groups: dict[tuple, list[tuple[str, _Turn, int]]] = {}
        closing = []  # finished turns with nothing left to push: only their end goes out
        for rid, t in turns:
            need = self._need(t)
            take = len(t.pending) if t.finished else len(t.pending) // need * need  # whole chunks: rows align
            if take:
                groups.setdefault((take, self.batch_key(t.decoder)), []).append((rid, t, take))
            else:
                closing.append((rid, t))
        pcm: dict[str, torch.Tensor] = {}
        ms: dict[str, float] = {}  # each turn's forward (ms)
        pushed = []
        if groups:
            members = next(iter(groups.values()))[: self.max_batch]  # the oldest turn's group
            part = []
            for rid, t, take in members:
                part.append((rid, t, torch.stack(t.pending[:take], dim=1)[None]))  # [1, G, n]
                del t.pending[:take]
                t.waiting_since = time.perf_counter() if t.pending else float("inf")
                pushed.append((rid, t))
            t0 = time.perf_counter()
            pcm.update(self._push(part))
            ms.update({rid: 1000 * (time.perf_counter() - t0) for rid, _, _ in part})
        if turns:
            self.steps += 1
            self.last_step_forwards = 1 if groups else 0
        return self._emit(pushed + closing, pcm, ms)

    def _push(self, part: list[tuple[str, _Turn, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One forward over ``part``'s chunks (a CUDA graph replay where one fits); ``{rid: samples [m]}``.
        A refused batch is pushed row by row so one bad turn fails alone."""
        streams, codes = [t.decoder for _, t, _ in part], torch.cat([c for _, _, c in part])
        self.forwards += 1
        self.rows += len(part)
        try:
            out = None if self.graphs is None else self.graphs.push_rows(streams, codes)
            if out is None:
                out = self.push_batch(streams, codes) if len(part) > 1 else streams[0].push(codes)
            return {rid: out[b, 0] for b, (rid, _, _) in enumerate(part)}
        except ValueError as e:
            if len(part) == 1:
                self.streams.pop(part[0][0], None)
                self.errors.append((part[0][0], f"code2wav: {e}"))
                return {}
        got: dict[str, torch.Tensor] = {}
        for row in part:
            got.update(self._push([row]))
        return got

    def _emit(
        self, turns: list[tuple[str, _Turn]], pcm: dict[str, torch.Tensor], ms: dict[str, float]
    ) -> list[StageMessage]:
        outs, now = [], time.perf_counter()
        for rid, t in turns:
            if rid not in self.streams:  # failed in its forward
                continue
            parts = [pcm[rid]] if rid in pcm else []
            if t.finished:
                parts.append(t.decoder.flush()[0, 0])
                self.streams.pop(rid)
            samples = torch.cat(parts).float() if parts else torch.zeros(0)
            meta = AudioOutput()
            if not t.started and samples.numel():  # its first audio: the TTFP split of this stage
                meta.talker_ms, meta.codec_ms = t.talker_ms, ms.get(rid)
                meta.codec_wait_ms = 1000 * (now - t.first_frame_at) if t.first_frame_at else None
            t.started = t.started or samples.numel() > 0
            if samples.numel() or t.finished:
                outs.append(StageMessage(rid, {"pcm": samples}, meta, last=t.finished))
        return outs
