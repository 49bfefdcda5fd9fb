"""Streaming Code2Wav pushes replayed as CUDA graphs per chunk size and batch bucket (the seed's Code2Wav
CUDA-graph buckets, batched across requests; a miss falls back to the eager push).

A :class:`~omniduplex.models.qwen3_omni.code2wav_stream.Code2WavStream` carries state of fixed shapes
between pushes (after its first), so the push of ``n`` frames of ``B`` streams stacked along the batch
(:mod:`~omniduplex.models.qwen3_omni.code2wav_batch`) is one fixed sequence of kernels: it is captured once
per chunk size ``n`` and batch bucket ``b`` (1, 2, 4, … ``max_batch``) on a template stream of ``b`` rows
whose state tensors are static inputs. To replay the push of ``B <= b`` streams, their states are copied
into the first ``B`` rows of those inputs (one copy per state tensor), the frames and each row's positions
are written (padding rows: zeros at positions ``0 … n − 1``, harmless: rows never mix), the graph replays,
and the new state is copied once into tensors the streams own (row ``i`` a view for stream ``i``). A push
whose size has no graph, more streams than the largest bucket, or streams still before their first push
(transposed convs cropping) run eagerly and count as a miss. The captured push is
:meth:`~.Code2WavStream.push_embedded` on the embedded frames: the same kernels as the eager push, so a
replay gives its samples.
"""

from __future__ import annotations

import torch

from omniduplex.models.qwen3_omni.code2wav import Code2Wav
from omniduplex.models.qwen3_omni.code2wav_batch import check_rows, give_rows
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream
from omniduplex.pipeline.engine.graph_runner import GraphRunner, bucket_sizes


class Code2WavGraphs:
    """Code2Wav pushes of ``chunk_sizes`` frames, ``1 … max_batch`` streams at once, replayed per size and
    batch bucket.

    Args:
        model: the decoder.
        backend: from :func:`omniduplex.pipeline.engine.graph_runner.make_backend`.
        chunk_sizes: the push sizes to capture (frames), e.g. the stage's first and steady chunk sizes.
        max_batch: most streams in one replay (buckets :func:`~.graph_runner.bucket_sizes`).

    Raises ValueError: no chunk size >= 1, or ``max_batch < 1``.
    """

    def __init__(self, model: Code2Wav, backend, chunk_sizes: list[int], max_batch: int = 1) -> None:
        sizes = sorted({n for n in chunk_sizes if n >= 1})
        if not sizes or max_batch < 1:
            raise ValueError(f"need a chunk size >= 1 and max_batch >= 1, got {chunk_sizes}, {max_batch}")
        self.model, self.buckets = model, bucket_sizes(max_batch)
        top = self.buckets[-1]
        self.runners = {n: GraphRunner(f"code2wav {n} frames", backend, self.buckets) for n in sizes}
        dev = model.code_embedding.weight.device
        self.codes = torch.zeros((top, model.cfg.num_quantizers, sizes[-1]), dtype=torch.int64, device=dev)
        self.positions = torch.zeros((top, sizes[-1]), dtype=torch.int64, device=dev)
        self.templates: dict[int, Code2WavStream] = {}
        self.misses = 0  # pushes run eagerly (no graph of their size or batch, or before a first push)
        with torch.no_grad():
            for b in self.buckets:
                t = self.templates[b] = Code2WavStream(model, b)
                t.push(self.codes[:b, :, :1])  # past its first push: the state has its final shapes
            self.inputs = [s.clone() for s in self.templates[top].state_tensors()]  # [top, ...] each
            for n, runner in self.runners.items():
                runner.capture(lambda b, n=n: self._callable(n, b))

    def _callable(self, n: int, b: int):
        codes, positions, inputs = self.codes[:b, :, :n], self.positions[:b, :n], [s[:b] for s in self.inputs]
        template, model = self.templates[b], self.model

        def push() -> tuple[torch.Tensor, ...]:
            template.load_state(inputs)
            x = model.code_embedding(codes + model.code_offset).mean(1)  # Code2Wav.embed without its checks
            pcm = template.push_embedded(x, positions)
            return (pcm, *template.state_tensors())

        return push

    def static_buffers(self) -> list[torch.Tensor]:
        """Every static input and output (tests check their data pointers never change)."""
        outs = [t for r in self.runners.values() for _, out in r.graphs.values() for t in out]
        return [self.codes, self.positions, *self.inputs, *outs]

    def push(self, stream: Code2WavStream, codes: torch.Tensor) -> torch.Tensor | None:
        """``stream.push(codes)`` (codes int ``[1, Q, n]``) by a replay, or ``None``: :meth:`push_rows`."""
        return self.push_rows([stream], codes)

    def push_rows(self, streams: list[Code2WavStream], codes: torch.Tensor) -> torch.Tensor | None:
        """:func:`~.code2wav_batch.push_together` (codes int ``[B, Q, n]``) by a replay of the bucket
        ``>= B``: float ``[B, 1, m]``; or ``None`` (nothing done) when ``n`` has no graph, ``B`` no bucket,
        or the streams are not past their first push (a miss: push eagerly).

        Raises:
            ValueError: as :func:`~.code2wav_batch.check_rows` (bad codes, a closed stream…), before any
                state changes.
        """
        n, rows = codes.shape[-1], len(streams)
        runner = self.runners.get(n)
        b = None if runner is None else runner.bucket_for(rows)
        if b is None or not all(s.batch == 1 and s.steady for s in streams):
            self.misses += 1
            return None
        check_rows(streams, codes)
        per = [s.state_tensors() for s in streams]
        for j, dst in enumerate(self.inputs):
            torch.cat([p[j] for p in per], out=dst[:rows])
        self.codes[:rows, :, :n].copy_(codes)
        self.codes[rows:b, :, :n].zero_()
        start = torch.tensor([s.pos for s in streams] + [0] * (b - rows), dtype=torch.int64)
        self.positions[:b, :n].copy_(start[:, None] + torch.arange(n)[None, :])
        pcm, *state = runner.replay(b)
        give_rows(streams, [t[:rows].clone() for t in state], n)
        return pcm[:rows].clone()

    def stats(self) -> dict[str, int]:
        """``cuda_graph_hits`` / ``cuda_graph_misses`` over every chunk size."""
        hits = sum(r.hits for r in self.runners.values())
        return {"cuda_graph_hits": hits, "cuda_graph_misses": self.misses}
