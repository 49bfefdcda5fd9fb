"""The Talker's code predictor as a graph per bucket of frames (:mod:`.graph_runner`).

One engine step of the Talker samples codebook 0 of ``n`` frames; the code predictor then fills codebooks
``1..G-1`` of all of them, ``G - 1`` short sequential steps with a sampling between each (~15 steps of a few
layers per frame for Qwen3-Omni: hundreds of small launches). The whole loop, sampling included, is captured
once per bucket of frames and replayed: the predictor's inputs (the Talker's hidden states, the codebook-0
ids, each frame's temperature, seed and noise counter) are written into static buffers, padding frames sample
greedily from stale rows and are dropped. The sampling is :func:`~.sampler.sample_static` with the
predictor's fixed filters, equal to the eager :func:`~.sampler.sample`: a replay gives the eager frames.
"""

from __future__ import annotations

import torch

from omniduplex.kernels import moe
from omniduplex.pipeline.engine.graph_runner import GraphRunner, bucket_sizes
from omniduplex.pipeline.engine.sampler import SamplingBatch, sample_static
from omniduplex.pipeline.engine.step_inputs import PackedUpload

NOISE_BASE = 1 << 40
"""Counter offset of the predictor's noise (the Talker's own draws use counters below it)."""


class PredictorGraphs:
    """Replays ``talker.code_predictor.predict`` per bucket of frames.

    Args:
        talker: the model (its ``code_predictor``, ``model.codec_embedding``, ``cfg.num_code_groups``).
        backend: from :func:`.graph_runner.make_backend`.
        max_frames: the most frames one step predicts (the engine's ``max_num_seqs``).
        top_k, top_p: the predictor's sampling filters (fixed: captured as constants).
    """

    def __init__(self, talker, backend, max_frames: int, top_k: int, top_p: float) -> None:
        self.talker, self.top_k_value, self.top_p_value = talker, top_k, top_p
        p = talker.codec_head.weight
        dev = p.device
        self.runner = GraphRunner("talker code predictor", backend, bucket_sizes(max_frames))
        top = self.runner.buckets[-1]
        self.hidden = torch.zeros((top, p.shape[1]), dtype=p.dtype, device=dev)
        self.code0 = torch.zeros(top, dtype=torch.int64, device=dev)
        self.params = PackedUpload(
            [("temperature", torch.float32, top), ("seeds", torch.int64, top), ("base", torch.int64, top)],
            dev,
            mirror=backend.name == "twin",
        )
        self.top_k = torch.full((top,), top_k, device=dev)
        self.top_p = torch.full((top,), top_p, device=dev)
        self.penalty = torch.ones(top, device=dev)
        with torch.no_grad():
            self.runner.capture(self._callable)

    def _callable(self, bucket: int):
        d = self.params.device_views
        temps, seeds, base = d["temperature"][:bucket], d["seeds"][:bucket], d["base"][:bucket]
        top_k, top_p, penalty = self.top_k[:bucket], self.top_p[:bucket], self.penalty[:bucket]
        hidden, code0 = self.hidden[:bucket], self.code0[:bucket]
        k, filtered = self.top_k_value, self.top_k_value > 0 or self.top_p_value < 1
        talker = self.talker

        def pick(logits: torch.Tensor, g: int) -> torch.Tensor:
            sb = SamplingBatch(temps, top_k, top_p, penalty, seeds, counters=base + g)
            return sample_static(logits, sb, k, k > 0, filtered)

        def run() -> torch.Tensor:
            embed = talker.model.codec_embedding(code0)
            with moe.sync_free():  # a dense predictor: no MoE; kept so a MoE one could not sync
                return talker.code_predictor.predict(hidden, code0, embed, sample=pick)

        return run

    def static_buffers(self) -> list[torch.Tensor]:
        """Every static input and output (tests check their data pointers never change)."""
        outs = [out for _, out in self.runner.graphs.values()]
        return [self.hidden, self.code0, self.params.device_buffer, self.params.host_buffer, *outs]

    def predict(
        self,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        temps: list[float],
        seeds: list[int],
        frames: list[int],
    ) -> torch.Tensor | None:
        """The frames ``[n, G]`` int64 of ``n`` rows (hidden ``[n, H]``, codebook-0 ids ``[n]``, each row's
        temperature, seed and frame index), or ``None`` when no bucket holds ``n`` (a miss)."""
        n = hidden.shape[0]
        bucket = self.runner.bucket_for(n)
        if bucket is None:
            self.runner.miss()
            return None
        groups = self.talker.cfg.num_code_groups
        buf = self.params
        buf.writable()
        h = buf.host
        h["temperature"][:n], h["temperature"][n:bucket] = temps, 0.0
        h["seeds"][:n], h["seeds"][n:bucket] = seeds, 0
        h["base"][:n] = [NOISE_BASE + f * groups for f in frames]
        h["base"][n:bucket] = NOISE_BASE
        buf.upload(buf.end("base", bucket))
        self.hidden[:n].copy_(hidden)
        self.code0[:n].copy_(code0)
        return self.runner.replay(bucket)[:n].clone()
