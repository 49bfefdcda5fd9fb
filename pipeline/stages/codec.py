"""The DAC vocoder stage of the unified graph: codec frames → waveform, streamed in windows.

Input: ``codes`` int64 ``[S]`` per frame (local ids), ``last`` when the turn's frames are complete.
Output: ``pcm`` float32 ``[n]`` at the codec's ``sampling_rate`` per decoded window; ``last`` on the
final one (possibly empty). The first window is ``initial_codec_chunk_frames`` long, later ones
``codec_chunk_frames``. DAC's convolutions are centred, so a window waits for ``right`` frames of
look-ahead and decodes with ``left`` frames of history; with both ``>=`` the receptive field the
concatenated windows equal the one-shot decode (:func:`omniduplex.models.dac.decode_window`).
"""

from __future__ import annotations

import torch

from omniduplex.models.dac import DacCodec, decode_window

from ..connector import ChunkingConfig, FrameStream
from ..messages import StageMessage


class CodecWorker:
    """Streaming DAC decoding of every turn in flight.

    Args:
        codec: the DAC decoder.
        chunking: window sizes (``initial_codec_chunk_frames``, ``codec_chunk_frames``).
        left, right: context frames; default the codec's receptive field (exact streaming).
    """

    def __init__(
        self,
        codec: DacCodec,
        chunking: ChunkingConfig | None = None,
        left: int | None = None,
        right: int | None = None,
    ) -> None:
        self.codec, self.cfg = codec, chunking or ChunkingConfig()
        rf = codec.receptive_field_frames()
        self.left = rf if left is None else left
        self.right = rf if right is None else right
        self.streams: dict[str, FrameStream] = {}

    def submit(self, msg: StageMessage) -> None:
        """Raises ValueError on a frame of the wrong shape (this turn only)."""
        s = self.streams.setdefault(msg.request_id, FrameStream())
        codes = msg.tensors.get("codes")
        if codes is not None:
            if codes.dim() != 1:
                raise ValueError(f"turn {msg.request_id}: codes must be [S], got {list(codes.shape)}")
            s.frames.append(codes.to(torch.int64))
        s.finished = s.finished or msg.last

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    def _window(self, s: FrameStream) -> int:
        """Frames of the next window to emit (0 = not ready yet)."""
        chunk = self.cfg.initial_codec_chunk_frames if s.emitted == 0 else self.cfg.codec_chunk_frames
        left = s.available - s.emitted
        if s.finished:
            return min(chunk, left)
        return chunk if left >= chunk + self.right else 0

    def has_work(self) -> bool:
        return any(s.finished or self._window(s) for s in self.streams.values())

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        outs, done = [], []
        for rid, s in self.streams.items():
            chunks = []
            while n := self._window(s):
                lo = max(s.offset, s.emitted - self.left)
                codes = s.codes(lo, s.available)[None]  # [1, S, frames since lo]
                a = s.emitted - lo
                wav = decode_window(self.codec, codes, a, a + n, a, self.right)
                chunks.append(wav[0, 0].float())
                s.emitted += n
            last = s.finished and s.emitted == s.available
            if chunks or last:
                pcm = torch.cat(chunks) if chunks else torch.zeros(0)
                outs.append(StageMessage(rid, {"pcm": pcm}, last=last))
            if last:
                done.append(rid)
            else:
                s.trim(self.left)
        for rid in done:
            self.streams.pop(rid)
        return outs
