"""Stage 3: Code2Wav. Buffers each request's codec frames and decodes windows with left context.

Input: the Talker's frames (``codes`` int64 ``[G]``, ``last``). Output: ``pcm`` float32 ``[n]`` at
24 kHz per decoded chunk; ``last`` on the request's final chunk (possibly empty). Windows of equal
length from different requests are decoded in one batched call.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from omniduplex.models.code2wav import Code2Wav
from omniduplex.models.code2wav_stream import decode_window

from ..connector import ChunkingConfig, FrameStream, decode_windows, frames_to_decode
from ..messages import StageMessage


class Code2WavWorker:
    """Streaming vocoder over all requests in flight.

    Raises:
        ValueError: at construction, when ``decode_left_context_frames`` cannot cover the decoder's
            lookahead tail (see :func:`decode_window`).
    """

    def __init__(self, model: Code2Wav, chunking: ChunkingConfig | None = None) -> None:
        self.model, self.cfg = model, chunking or ChunkingConfig()
        u, la = model.total_upsample, model.lookahead_samples
        if self.cfg.decode_left_context_frames * u < la:
            raise ValueError(
                f"decode_left_context_frames={self.cfg.decode_left_context_frames} is too small: "
                f"the decoder needs >= {-(-la // u)} frames to emit its lookahead tail"
            )
        self.streams: dict[str, FrameStream] = {}

    def submit(self, msg: StageMessage) -> None:
        s = self.streams.setdefault(msg.request_id, FrameStream())
        if "codes" in msg.tensors:
            s.frames.append(msg.tensors["codes"])
        s.finished = s.finished or msg.last

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    def has_work(self) -> bool:
        return any(
            s.finished or frames_to_decode(s.available, s.emitted, False, self.cfg)
            for s in self.streams.values()
        )

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        jobs: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)  # (ctx, len) → windows
        done: list[str] = []
        for rid, s in self.streams.items():
            n = frames_to_decode(s.available, s.emitted, s.finished, self.cfg)
            for a, b in decode_windows(s.emitted, s.emitted + n, self.cfg):
                ctx = min(self.cfg.decode_left_context_frames, a)
                jobs[(ctx, b - a)].append((rid, a, b))
            s.emitted += n
            if s.finished and s.emitted == s.available:
                done.append(rid)
        pcm: dict[str, list[tuple[int, torch.Tensor]]] = defaultdict(list)
        for (ctx, _), windows in jobs.items():
            codes = torch.stack([self.streams[rid].codes(a - ctx, b) for rid, a, b in windows])
            for (rid, a, _), wav in zip(windows, self._decode(codes, ctx, windows)):
                pcm[rid].append((a, wav))
        outs = []
        for rid in list(pcm) + [r for r in done if r not in pcm]:
            chunks = [w for _, w in sorted(pcm.get(rid, []), key=lambda x: x[0])]
            wav = torch.cat(chunks) if chunks else torch.zeros(0)
            outs.append(StageMessage(rid, {"pcm": wav.float()}, last=rid in done))
        for rid in done:
            self.streams.pop(rid)
        for s in self.streams.values():
            s.trim(self.cfg.decode_left_context_frames)
        return outs

    def _decode(self, codes: torch.Tensor, ctx: int, windows) -> list[torch.Tensor]:
        a0 = windows[0][1]
        # windows in one job share (context, length), so one call serves all; start>0 iff ctx>0 or a0>0
        starts = {a for _, a, _ in windows}
        if len(starts) > 1 and any(a == 0 for a in starts):
            return [self._decode(codes[i : i + 1], ctx, [w])[0] for i, w in enumerate(windows)]
        wav = decode_window(self.model, codes, a0, a0 + codes.shape[-1] - ctx, ctx, codes_offset=a0 - ctx)
        return list(wav[:, 0])
