"""The vocoder stage of both graphs: codec frames → waveform, streamed with per-layer decoder state.

Qwen3-Omni runs Code2Wav (:class:`~omniduplex.models.qwen3_omni.code2wav_stream.Code2WavStream`, 24 kHz), the
unified LM the DAC decoder (:class:`~omniduplex.models.codecs.dac_stream.DacDecodeStream`, the codec's rate).
Each turn keeps one stream, so every frame is decoded once and the concatenated output equals the
one-shot decode of the turn's frames.

Input: ``codes`` int64 ``[G]`` per frame, ``last`` when the turn's frames are complete.
Output: ``pcm`` float32 ``[n]``, every sample no later frame can change; ``last`` on the turn's final
message (possibly empty). Frames are pushed in groups of ``initial_codec_chunk_frames`` until the first
samples come out (at once for causal Code2Wav; after ~9 frames of look-ahead for DAC's centred convs),
then of ``codec_chunk_frames``; on ``last`` whatever is pending.
"""

from __future__ import annotations

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


class VocoderWorker(StreamGauges):
    """Streaming decode of every turn in flight.

    Args:
        new_stream: makes one turn's decoder stream (e.g. ``lambda: Code2WavStream(model)``).
        chunking: push cadence (``initial_codec_chunk_frames``, ``codec_chunk_frames``).
        graphs: replays pushes as CUDA graphs where it can (``push(stream, codes) -> samples | None``,
            :class:`~.code2wav_graphs.Code2WavGraphs`); ``None`` pushes eagerly.
    """

    def __init__(
        self,
        new_stream: Callable[[], VocoderStream],
        chunking: ChunkingConfig | None = None,
        graphs=None,
    ) -> None:
        self.new_stream, self.cfg, self.graphs = new_stream, chunking or ChunkingConfig(), graphs
        self.streams: dict[str, _Turn] = {}

    def submit(self, msg: StageMessage) -> None:
        """Raises ValueError on a frame of the wrong shape (this turn only)."""
        codes = msg.tensors.get("codes")
        if codes is not None and codes.dim() != 1:
            raise ValueError(f"turn {msg.request_id}: codes must be [G], got {list(codes.shape)}")
        t = self.streams.get(msg.request_id)
        if t is None:
            t = self.streams[msg.request_id] = _Turn(self.new_stream())
        if codes is not None:
            t.pending.append(codes.to(torch.int64))
        t.finished = t.finished or msg.last

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    def stats(self) -> dict[str, int]:
        """Open streams (``batch_size``), and ``cuda_graph_hits`` / ``cuda_graph_misses`` of the pushes when
        it has CUDA graphs."""
        return {**super().stats(), **({} if self.graphs is None else self.graphs.stats())}

    def _ready(self, t: _Turn) -> bool:
        need = self.cfg.codec_chunk_frames if t.started else self.cfg.initial_codec_chunk_frames
        return t.finished or len(t.pending) >= need

    def has_work(self) -> bool:
        return any(self._ready(t) for t in self.streams.values())

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        """Push ready turns' pending frames; one message per turn that has new samples or ended.

        Turns with no audio out yet go first, alone in their step: their first packet (TTFP) does not
        wait behind the steady chunks of the other turns, which have audio buffered at the client.
        """
        outs, done = [], []
        ready = [(rid, t) for rid, t in self.streams.items() if self._ready(t)]
        first = [(rid, t) for rid, t in ready if not t.started]
        for rid, t in first or ready:
            parts = []
            if t.pending:
                codes = torch.stack(t.pending, dim=1)[None]
                out = None if self.graphs is None else self.graphs.push(t.decoder, codes)
                parts.append((t.decoder.push(codes) if out is None else out)[0, 0])
                t.pending.clear()
            if t.finished:
                parts.append(t.decoder.flush()[0, 0])
                done.append(rid)
            pcm = torch.cat(parts).float() if parts else torch.zeros(0)
            t.started = t.started or pcm.numel() > 0
            if pcm.numel() or t.finished:
                outs.append(StageMessage(rid, {"pcm": pcm}, AudioOutput(), last=t.finished))
        for rid in done:
            self.streams.pop(rid)
        return outs
