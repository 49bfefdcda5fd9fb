"""Stage 2 of the Qwen3-TTS graph: codec frames → 24 kHz speech, streamed, several utterances per call.

Each utterance has one :class:`~omniduplex.models.qwen3_tts.codec_stream.StreamingDecoder` (per-layer
decoder state: each frame is decoded once, the pieces put together equal the one-shot decode), made by its
first frame and dropped with its last message or an abort. Pieces follow the graph's ``chunking``:
``tts_first_chunk_frames`` frames first (1 = 80 ms of audio), then ``tts_chunk_frames`` (25), the rest at
the end.

Each step decodes the utterances with a piece due: those with the same number of frames to decode go
through the decoder together (:func:`~omniduplex.models.qwen3_tts.codec_batch.push_together`: states stacked
along the batch, each row equal to its utterance decoded alone). Utterances with no audio out yet go first,
alone in their step, so a first piece (TTFP) never waits behind the 25-frame chunks of utterances already
playing.

Input: ``codes`` int64 ``[16]`` per frame; ``last`` when the utterance's frames are complete (the closing
message may have no codes); meta ``talker_ms`` on the first frame is passed on with the first piece.
Output: ``pcm`` float32 ``[k·1920]`` per piece, meta ``chunk`` (0, 1, ...) and ``codec_ms`` (the decode call
that made it, ms); the utterance's final message has ``last=True`` (its ``pcm`` may be empty).
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import torch

from omniduplex.models.qwen3_tts.codec import STREAM_CHUNK, STREAM_FIRST_CHUNK, CodecDecoder
from omniduplex.models.qwen3_tts.codec_batch import push_together
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.pipeline.messages import AudioOutput, DecoderOutput, StageMessage
from omniduplex.pipeline.stages.contract import WorkerBase

_ABORTED_MEMORY = 1024
FRAMES_PER_CALL = 200
"""Most frames one decode call takes (all utterances together; one utterance's piece at least): about 2 s of
decode on the small preset here, so the stage reads its input edge often enough to keep the talker's credits
flowing."""


@dataclass
class _Utterance:
    decoder: StreamingDecoder
    finished: bool = False  # the talker sent the last frame
    chunk: int = 0  # pieces sent
    talker_ms: float | None = None  # the talker's first-frame time, passed on with the first piece


class Qwen3TTSCodecWorker(WorkerBase):
    """Streaming, batched codec decode of every utterance in flight.

    Args:
        codec: the 12 Hz codec decoder (shared by all streams).
        first_chunk, chunk: frames of the first piece and of each later one (>= 1).
        max_batch: utterances decoded in one call at most.

    Raises ValueError: a chunk size or ``max_batch`` < 1.
    """

    def __init__(
        self,
        codec: CodecDecoder,
        first_chunk: int = STREAM_FIRST_CHUNK,
        chunk: int = STREAM_CHUNK,
        max_batch: int = 64,
    ) -> None:
        StreamingDecoder(codec, first_chunk, chunk)  # checks the sizes now
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.codec, self.first_chunk, self.chunk, self.max_batch = codec, first_chunk, chunk, max_batch
        self.streams: dict[str, _Utterance] = {}
        self._aborted: OrderedDict[str, None] = OrderedDict()  # late frames of these are dropped
        self.calls = self.rows = self.frames = 0  # decode calls, the utterance-rows and frames they decoded
        self.decode_s = 0.0  # wall time of the decode calls (s)

    def submit(self, msg: StageMessage) -> None:
        """Queue one frame (or the end) of an utterance.

        Raises ValueError: a frame not int ``[16]`` with ids in the codebook (this utterance only; the frame
        is not kept).
        """
        if msg.request_id in self._aborted:
            return
        codes = msg.tensors.get("codes")
        u = self.streams.get(msg.request_id)
        if u is None:  # its first frame (or, with no frames at all, its end): a fresh decoder state
            u = _Utterance(StreamingDecoder(self.codec, self.first_chunk, self.chunk))
            u.talker_ms = msg.meta.talker_ms if isinstance(msg.meta, DecoderOutput) else None
            self.streams[msg.request_id] = u
        if codes is not None:
            if codes.dim() != 1:
                raise ValueError(f"utterance {msg.request_id}: codes must be [G], got {list(codes.shape)}")
            u.decoder.feed(codes.to(torch.int64).view(1, -1, 1))
        u.finished = u.finished or msg.last

    def abort(self, request_id: str) -> None:
        """Drop the utterance's decoder state and pending frames; frames still on the way are ignored."""
        self.streams.pop(request_id, None)
        self._aborted[request_id] = None
        while len(self._aborted) > _ABORTED_MEMORY:
            self._aborted.popitem(last=False)

    def _due(self, u: _Utterance) -> bool:
        return u.finished or bool(u.decoder.due())

    def has_work(self) -> bool:
        return any(self._due(u) for u in self.streams.values())

    def stats(self) -> dict:
        """Gauges: open streams (``batch_size``); so far: decode ``calls``, the utterance-``rows`` and
        ``frames`` they decoded and their wall time ``decode_s`` (s)."""
        return {
            "queue_depth": 0,
            "batch_size": len(self.streams),
            "calls": self.calls,
            "rows": self.rows,
            "frames": self.frames,
            "decode_s": self.decode_s,
        }

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        """One batched decode call (first pieces first), so the stage reads its input between calls: the
        largest group of due utterances with the same number of frames to decode, at most ``max_batch``
        of them and :data:`FRAMES_PER_CALL` frames in all (one utterance at least). One message per piece,
        ``last`` on the final one of a finished utterance; finished utterances with nothing left close
        here too."""
        outs: list[StageMessage] = []
        due: list[tuple[str, _Utterance, list[int]]] = []
        for rid, u in list(self.streams.items()):
            sizes = u.decoder.due(u.finished)
            if sizes:
                due.append((rid, u, sizes))
            elif u.finished:  # its last frames are decoded: only the closing message is left
                outs += self._close(rid, u, [])
        first = [d for d in due if d[1].chunk == 0]
        groups: dict[int, list[tuple[str, _Utterance, list[int]]]] = defaultdict(list)
        for d in first or due:
            groups[sum(d[2])].append(d)
        if not groups:
            return outs
        n, members = max(groups.items(), key=lambda g: len(g[1]))
        members = members[: max(1, min(self.max_batch, FRAMES_PER_CALL // n))]
        taken = []
        for rid, u, _ in members:
            codes, sizes = u.decoder.take(u.finished)
            taken.append((rid, u, codes, sizes))
        return outs + self._decode(taken)

    def _decode(self, members: list[tuple[str, _Utterance, torch.Tensor, list[int]]]) -> list[StageMessage]:
        t0 = time.perf_counter()
        streams = [u.decoder.stream for _, u, _, _ in members]
        samples = push_together(streams, torch.cat([m[2] for m in members]))
        dt = time.perf_counter() - t0
        ms = 1000 * dt
        self.calls += 1
        self.rows += len(members)
        self.frames += samples.shape[0] * samples.shape[-1] // self.codec.total_upsample
        self.decode_s += dt
        outs = []
        for b, (rid, u, _, sizes) in enumerate(members):
            pieces = [p.reshape(-1).float() for p in u.decoder.split(samples[b : b + 1], sizes)]
            if u.finished and not u.decoder.pending:
                outs += self._close(rid, u, pieces, ms)
                continue
            outs += [self._piece(rid, u, p, ms) for p in pieces]
        return outs

    @staticmethod
    def _piece(rid: str, u: _Utterance, pcm: torch.Tensor, ms: float, last: bool = False) -> StageMessage:
        meta = AudioOutput(chunk=u.chunk, codec_ms=ms, talker_ms=u.talker_ms)
        u.talker_ms = None
        u.chunk += 1
        return StageMessage(rid, {"pcm": pcm}, meta, last=last)

    def _close(
        self, rid: str, u: _Utterance, pieces: list[torch.Tensor], ms: float = 0.0
    ) -> list[StageMessage]:
        """The utterance's last pieces, the final one marked ``last``; its state is dropped."""
        del self.streams[rid]
        pieces = pieces or [torch.zeros(0)]
        return [self._piece(rid, u, p, ms, last=i == len(pieces) - 1) for i, p in enumerate(pieces)]
