"""The DAC vocoder stage of the unified graph: codec frames → waveform, streamed with per-layer state.

Input: ``codes`` int64 ``[S]`` per frame (local ids), ``last`` when the turn's frames are complete.
Output: ``pcm`` float32 ``[n]`` at the codec's ``sampling_rate``, every sample that no later frame can
change; ``last`` on the final message (possibly empty). Each turn keeps a
:class:`~omniduplex.models.dac_stream.DacDecodeStream`, so every frame is decoded once and the
concatenated output equals the one-shot decode. Frames are pushed every ``initial_codec_chunk_frames``
until the first samples come out (DAC's centred convolutions need ~9 frames of look-ahead before
that), then every ``codec_chunk_frames``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omniduplex.models.dac import DacCodec
from omniduplex.models.dac_stream import DacDecodeStream

from ..connector import ChunkingConfig
from ..messages import StageMessage


@dataclass
class _Turn:
    decoder: DacDecodeStream
    pending: list[torch.Tensor] = field(default_factory=list)  # frames not pushed yet, each int64 [S]
    finished: bool = False
    started: bool = False  # some audio has gone out


class CodecWorker:
    """Streaming DAC decoding of every turn in flight.

    Args:
        codec: the DAC decoder.
        chunking: push cadence (``initial_codec_chunk_frames``, ``codec_chunk_frames``).
    """

    def __init__(self, codec: DacCodec, chunking: ChunkingConfig | None = None) -> None:
        self.codec, self.cfg = codec, chunking or ChunkingConfig()
        self.streams: dict[str, _Turn] = {}

    def submit(self, msg: StageMessage) -> None:
        """Raises ValueError on a frame of the wrong shape (this turn only)."""
        codes = msg.tensors.get("codes")
        if codes is not None and codes.dim() != 1:
            raise ValueError(f"turn {msg.request_id}: codes must be [S], got {list(codes.shape)}")
        t = self.streams.get(msg.request_id)
        if t is None:
            t = self.streams[msg.request_id] = _Turn(DacDecodeStream(self.codec))
        if codes is not None:
            t.pending.append(codes.to(torch.int64))
        t.finished = t.finished or msg.last

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    def _ready(self, t: _Turn) -> bool:
        need = self.cfg.codec_chunk_frames if t.started else self.cfg.initial_codec_chunk_frames
        return t.finished or len(t.pending) >= need

    def has_work(self) -> bool:
        return any(self._ready(t) for t in self.streams.values())

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        outs, done = [], []
        for rid, t in self.streams.items():
            if not self._ready(t):
                continue
            parts = []
            if t.pending:
                parts.append(t.decoder.push(torch.stack(t.pending, dim=1)[None])[0, 0])
                t.pending.clear()
            if t.finished:
                parts.append(t.decoder.flush()[0, 0])
                done.append(rid)
            pcm = torch.cat(parts).float() if parts else torch.zeros(0)
            t.started = t.started or pcm.numel() > 0
            if pcm.numel() or t.finished:
                outs.append(StageMessage(rid, {"pcm": pcm}, last=t.finished))
        for rid in done:
            self.streams.pop(rid)
        return outs
