"""Per-slot sampling parameters kept on the device: a step sends only its slots and counters.

Every request holds an engine slot from admission to its end. Its temperature, top-k, top-p, repetition
penalty, seed, suppressed ids and the counts of the ids it generated live in device tables indexed by slot,
written once at admission (:meth:`SamplingTables.set`). A step uploads its slots and the requests' token
counters with one copy (:class:`~.step_inputs.PackedUpload`) and gathers its rows on the device, instead of
building every tensor of its :class:`~.sampler.SamplingBatch` from Python lists. Host mirrors of the
temperature, penalty and suppression flags give the sampler its host-side hints (an all-greedy batch skips
the draw and the gathers it would need) without a device sync.
"""

from __future__ import annotations

import torch

from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.sampler import SamplingBatch
from omniduplex.pipeline.engine.step_inputs import PackedUpload


class SamplingTables:
    """Device tables of ``rows`` slots over a ``vocab``-id vocabulary (rows grow with the engine's slots).

    ``counts`` (int32 ``[rows, vocab]``): how often each id was generated, for the repetition penalty.
    ``suppress`` (bool ``[rows, vocab]``): allocated when a request first names ids never to sample.
    """

    def __init__(self, vocab: int, device: torch.device, mirror: bool = False) -> None:
        self.vocab, self.device, self.mirror = vocab, device, mirror
        self.rows = 0
        dev = device
        self.temperature = torch.zeros(0, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(0, dtype=torch.int64, device=dev)
        self.top_p = torch.ones(0, dtype=torch.float32, device=dev)
        self.repetition_penalty = torch.ones(0, dtype=torch.float32, device=dev)
        self.seeds = torch.zeros(0, dtype=torch.int64, device=dev)
        self.counts = torch.zeros((0, vocab), dtype=torch.int32, device=dev)
        self.suppress: torch.Tensor | None = None
        self._random: list[bool] = []  # host mirrors: temperature > 0, penalty != 1, suppressed ids
        self._penalised: list[bool] = []
        self._suppressed: list[bool] = []
        self._upload: PackedUpload | None = None
        self._cap = 0
        self._zeros_f = self._zeros_i = self._ones_f = self._ones_count = None

    def grow(self, rows: int) -> None:
        """Hold at least ``rows`` slots (new rows zero)."""
        if rows <= self.rows:
            return
        extra = rows - self.rows

        def pad(t: torch.Tensor, fill: float = 0) -> torch.Tensor:
            return torch.cat((t, t.new_full((extra, *t.shape[1:]), fill)))

        self.temperature, self.top_k, self.seeds = pad(self.temperature), pad(self.top_k), pad(self.seeds)
        self.top_p, self.repetition_penalty = pad(self.top_p, 1), pad(self.repetition_penalty, 1)
        self.counts = pad(self.counts)
        if self.suppress is not None:
            self.suppress = pad(self.suppress)
        for flags in (self._random, self._penalised, self._suppressed):
            flags += [False] * extra
        self.rows = rows

    def set(self, slot: int, sp: SamplingParams) -> None:
        """Write the parameters of the request admitted to ``slot`` (its seed must be set) and clear its
        counts."""
        self.temperature[slot] = sp.temperature
        self.top_k[slot] = sp.top_k
        self.top_p[slot] = sp.top_p
        self.repetition_penalty[slot] = sp.repetition_penalty
        self.seeds[slot] = sp.seed
        self.counts[slot].zero_()
        self._random[slot] = sp.temperature > 0
        self._penalised[slot] = sp.repetition_penalty != 1.0
        ids = sp.never_sampled
        self._suppressed[slot] = bool(ids)
        if ids:
            if self.suppress is None:
                self.suppress = torch.zeros((self.rows, self.vocab), dtype=torch.bool, device=self.device)
            self.suppress[slot].zero_()
            self.suppress[slot, torch.tensor(ids, dtype=torch.int64, device=self.device)] = True

    def _buffers(self, n: int) -> PackedUpload:
        if n > self._cap:
            self._cap = max(n, 2 * self._cap, 8)
            self._upload = PackedUpload(
                [("slots", torch.int64, self._cap), ("counters", torch.int64, self._cap)],
                self.device,
                self.mirror,
            )
            dev = self.device
            self._zeros_f = torch.zeros(self._cap, dtype=torch.float32, device=dev)
            self._ones_f = torch.ones(self._cap, dtype=torch.float32, device=dev)
            self._zeros_i = torch.zeros(self._cap, dtype=torch.int64, device=dev)
            self._ones_count = torch.ones(self._cap, dtype=torch.int32, device=dev)
        return self._upload

    def batch(self, reqs: list[Request]) -> tuple[SamplingBatch, torch.Tensor, bool]:
        """The :class:`SamplingBatch` of ``reqs`` (one upload, gathers on the device), their slots on the
        device, and whether any of them uses the repetition penalty (then :meth:`count` must follow)."""
        n = len(reqs)
        buf = self._buffers(n)
        slots = [r.slot for r in reqs]
        buf.writable()
        buf.host["slots"][:n] = slots
        buf.host["counters"][:n] = [len(r.output_ids) for r in reqs]
        buf.upload(buf.end("counters", n))
        d_slots, counters = buf.device_views["slots"][:n], buf.device_views["counters"][:n]
        greedy = not any(self._random[s] for s in slots)
        penalised = any(self._penalised[s] for s in slots)
        if greedy:
            temperature, top_p, seeds = self._zeros_f[:n], self._ones_f[:n], self._zeros_i[:n]
            top_k = self._zeros_i[:n]
        else:
            temperature, top_p = self.temperature[d_slots], self.top_p[d_slots]
            top_k, seeds = self.top_k[d_slots], self.seeds[d_slots]
        sb = SamplingBatch(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=self.repetition_penalty[d_slots] if penalised else self._ones_f[:n],
            seeds=seeds,
            counters=counters,
            counts=self.counts[d_slots] if penalised else None,
            suppress=self.suppress[d_slots] if any(self._suppressed[s] for s in slots) else None,
            all_greedy=greedy,
        )
        return sb, d_slots, penalised

    def count(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Add the sampled ``tokens`` int64 ``[n]`` to the counts of ``slots`` ``[n]``."""
        self.counts.index_put_((slots, tokens), self._ones_count[: tokens.shape[0]], accumulate=True)
