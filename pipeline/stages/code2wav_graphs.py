"""Streaming Code2Wav pushes replayed as CUDA graphs per chunk size (the seed's Code2Wav CUDA-graph buckets;
a miss falls back to the eager push).

A :class:`~omniduplex.models.qwen3_omni.code2wav_stream.Code2WavStream` carries state of fixed shapes
between pushes (after its first), so the push of ``n`` frames is one fixed sequence of kernels: it is
captured once per chunk size ``n`` on a template stream whose state tensors are static inputs. To replay a
push of a turn's stream, its state is copied into those inputs (one multi-tensor copy), the frames and their
positions are written, the graph of ``n`` replays, and the new state is copied back into tensors the stream
owns. A push whose size has no graph, or a stream's first push (its transposed convs still cropping), runs
eagerly and is counted as a miss. The captured push is :meth:`~.Code2WavStream.push_embedded` on the
embedded frames: the same kernels as the eager push, so a replay gives its samples.
"""

from __future__ import annotations

import torch

from omniduplex.models.qwen3_omni.code2wav import Code2Wav
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream
from omniduplex.pipeline.engine.graph_runner import GraphRunner


class Code2WavGraphs:
    """Code2Wav pushes of ``chunk_sizes`` frames (one stream row) replayed per size.

    Args:
        model: the decoder.
        backend: from :func:`omniduplex.pipeline.engine.graph_runner.make_backend`.
        chunk_sizes: the push sizes to capture (frames), e.g. the stage's first and steady chunk sizes.
    """

    def __init__(self, model: Code2Wav, backend, chunk_sizes: list[int]) -> None:
        self.model = model
        sizes = sorted({n for n in chunk_sizes if n >= 1})
        self.runner = GraphRunner("code2wav", backend, sizes)
        dev = model.code_embedding.weight.device
        self.codes = torch.zeros((1, model.cfg.num_quantizers, sizes[-1]), dtype=torch.int64, device=dev)
        self.positions = torch.zeros(sizes[-1], dtype=torch.int64, device=dev)
        self.template = Code2WavStream(model)
        with torch.no_grad():
            self.template.push(self.codes[..., :1])  # past its first push: the state has its final shapes
            self.inputs = [t.clone() for t in self.template.state_tensors()]
            self.runner.capture(self._callable)

    def _callable(self, n: int):
        codes, positions, template, model = self.codes[..., :n], self.positions[:n], self.template, self.model

        def push() -> tuple[torch.Tensor, ...]:
            template.load_state(self.inputs)
            x = model.code_embedding(codes + model.code_offset).mean(1)  # Code2Wav.embed without its checks
            pcm = template.push_embedded(x, positions)
            return (pcm, *template.state_tensors())

        return push

    def static_buffers(self) -> list[torch.Tensor]:
        """Every static input and output (tests check their data pointers never change)."""
        outs = [t for _, out in self.runner.graphs.values() for t in out]
        return [self.codes, self.positions, *self.inputs, *outs]

    def push(self, stream: Code2WavStream, codes: torch.Tensor) -> torch.Tensor | None:
        """``stream.push(codes)`` (codes int ``[1, Q, n]``) by a replay, or ``None`` (nothing done) when ``n``
        has no graph or the stream is not past its first push (a miss: push eagerly).

        Raises:
            ValueError: bad codes (:meth:`Code2Wav.embed`'s checks), before any state changes.
        """
        n = codes.shape[-1]
        if n not in self.runner.graphs or stream.batch != 1 or not stream.steady or stream.done:
            self.runner.miss()
            return None
        self.model.check_codes(codes)
        if codes.shape[0] != 1:
            raise ValueError(f"codes must be [1, Q, n], got shape {list(codes.shape)}")
        torch._foreach_copy_(self.inputs, stream.state_tensors())
        self.codes[..., :n].copy_(codes)
        torch.arange(stream.pos, stream.pos + n, out=self.positions[:n])
        pcm, *state = self.runner.replay(n)
        owned = getattr(stream, "graph_state", None)
        if owned is None:
            owned = stream.graph_state = [t.clone() for t in state]
        else:
            torch._foreach_copy_(owned, state)
        stream.load_state(owned)
        stream.transformer.pos += n
        return pcm.clone()

    def stats(self) -> dict[str, int]:
        return self.runner.stats()
