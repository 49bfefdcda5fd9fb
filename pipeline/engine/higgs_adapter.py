"""Engine adapter of the Higgs Audio v3 talker: 8 codebooks per step in the delay pattern, decode state as a
slot table.

Each engine step samples a request's ``N`` codes at once (one head GEMM for the batch, one distribution per
codebook), applies the delay-pattern rules of :mod:`omniduplex.models.higgs.rules` (BOC/EOC forcing, the end
countdown) and emits the frame the step completes, un-delayed. The step's codes are the next input row
(their fused embedding).

The lever (``lever=True``): every request's decode state — steps taken, end countdown, done flag, per-step
codes (the last row is the next input; all rows make a preempted request's recompute exact), sampling
parameters — lives in tensors indexed by the request's engine slot (``Request.slot``). A step gathers the
rows of its slots, runs the rules on ``[B, N]`` tensors and scatters the new state back: no Python loop over
requests in the state update, one source of truth whatever order the scheduler gives, however the batch
shrinks or grows, and when requests finish (their slots are reset when reused). ``lever=False`` keeps the
same state per request in ``Request.extra`` and runs sampling and :func:`~omniduplex.models.higgs.rules.
step_one` request by request (the per-request loop the lever replaces); results are identical.

The scheduler's token per step is a marker (:data:`ENDED`: the clip ended this step, else 0); the codes
are in the state and in the step's extras (``"codes"``: the completed frame, ``N`` ints).
"""

from __future__ import annotations

import time

import torch

from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.higgs.prompt import HiggsPrompt
from omniduplex.models.higgs.rules import DelayRules, advance, forced, step_one
from omniduplex.models.higgs.talker import HiggsTalker
from omniduplex.pipeline.engine.prefix_cache import tensor_bytes
from omniduplex.pipeline.engine.request import Request
from omniduplex.pipeline.engine.sampler import SamplingBatch, sample_inverse_cdf

INT_COLUMNS = ("steps", "eoc", "done", "max_tokens", "ignore_eos", "top_k", "seed")
"""Columns of the slot table's int64 part: steps sampled (the delay count), end countdown (−1: not begun),
done flag, and the request's sampling parameters. The last codes are ``hist[slot, steps − 1]``."""
ENDED = 1
"""Scheduler token of a step that ended the clip (the request's ``stop_token_ids``); other steps give 0."""
PLACEHOLDER_ID = 0
"""Scheduler id of an audio prompt row (its content is keyed by :meth:`HiggsAdapter.row_key`)."""


class HiggsAdapter:
    """Adapter for :class:`HiggsTalker` (module docstring).

    Args:
        model: the talker.
        rules: the delay-pattern rule set.
        max_steps: most steps (frames + delay) one request may take; the slot table holds this many rows.
        lever: slot-table state and batched rules (True) or a per-request loop (False).

    Counters (host seconds over all steps): ``state_seconds`` (the decode-state work: gathering and scattering
    the state, the rules, the frame gather, the outputs), ``sample_seconds`` (drawing the ``N`` codes of every
    request from its logits), ``head_seconds`` (the head GEMM); ``decode_steps``.
    """

    def __init__(
        self, model: HiggsTalker, rules: DelayRules, max_steps: int = 2048, lever: bool = True
    ) -> None:
        cfg = model.cfg
        self.model, self.cfg, self.rules, self.lever, self.max_steps = model, cfg, rules, lever, max_steps
        self.num_layers, self.num_kv_heads, self.head_dim = (
            cfg.text.num_hidden_layers,
            cfg.text.num_key_value_heads,
            cfg.text.head_dim,
        )
        self.vocab_size = cfg.text.vocab_size
        self.n = cfg.num_codebooks
        self.device = model.text_embedding.weight.device
        self.cb = torch.arange(self.n, device=self.device)
        self.cap = 0
        self._alloc(0)
        self.state_seconds = self.sample_seconds = self.head_seconds = 0.0
        self.decode_steps = 0

    # -- slot table -------------------------------------------------------------------------------------
    def _alloc(self, cap: int) -> None:
        """Grow the table to ``cap`` slots: ``ints`` int64 ``[cap, 7]`` (:data:`INT_COLUMNS`), ``floats`` fp32
        ``[cap, 2]`` (temperature, top-p), ``hist`` int64 ``[cap, max_steps, N]`` (every step's codes)."""
        old = getattr(self, "ints", None)
        ints = torch.zeros((cap, len(INT_COLUMNS)), dtype=torch.int64, device=self.device)
        floats = torch.ones((cap, 2), dtype=torch.float32, device=self.device)
        hist = torch.zeros((cap, self.max_steps, self.n), dtype=torch.int64, device=self.device)
        if old is not None:
            ints[: self.cap], floats[: self.cap], hist[: self.cap] = self.ints, self.floats, self.hist
        self.ints, self.floats, self.hist, self.cap = ints, floats, hist, cap

    def on_added(self, req: Request) -> None:
        """Reset ``req``'s slot row (or its per-request state) and store its sampling parameters (the caller
        has checked ``max_tokens <= max_steps`` and put a :class:`HiggsPrompt` in ``req.extra["prompt"]``)."""
        sp = req.sampling
        if not self.lever:
            req.extra["state"] = {"steps": 0, "eoc": -1, "hist": []}
            return
        if req.slot >= self.cap:
            self._alloc(max(8, 2 * self.cap, req.slot + 1))
        row = (0, -1, 0, sp.max_tokens, int(sp.ignore_eos), sp.top_k, sp.seed)
        self.ints[req.slot] = torch.tensor(row, dtype=torch.int64)
        self.floats[req.slot] = torch.tensor((sp.temperature, sp.top_p), dtype=torch.float32)

    def _hist_rows(self, req: Request, j0: int, j1: int) -> torch.Tensor:
        if self.lever:
            return self.hist[req.slot, j0:j1]
        return torch.tensor(req.extra["state"]["hist"][j0:j1], dtype=torch.int64, device=self.device)

    # -- engine hooks ------------------------------------------------------------------------------------
    def input_embeds(self, items: list[tuple[Request, int]]) -> torch.Tensor:
        """Rows ``num_computed .. + n`` of every item: prompt rows (text or delayed reference codes), then
        the codes of the request's earlier steps; decode rows of slot-table requests in one gather."""
        ids, codes, at = [], [], 0
        dec_pos, dec_slot, dec_step = [], [], []
        for req, n in items:
            s, p = req.num_computed, req.num_prompt
            prompt: HiggsPrompt = req.extra["prompt"]
            if s < p:
                e = min(s + n, p)
                ids.append(prompt.ids[s:e])
                codes.append(prompt.codes[s:e])
            if s + n > p:
                j0, j1 = max(s, p) - p, s + n - p
                if self.lever and j1 - j0 == 1:
                    dec_pos.append(at + max(0, p - s))
                    dec_slot.append(req.slot)
                    dec_step.append(j0)
                    rows = torch.zeros(1, self.n, dtype=torch.int64)
                else:
                    rows = self._hist_rows(req, j0, j1).cpu()
                ids.append(torch.full((j1 - j0,), -1, dtype=torch.int64))
                codes.append(rows)
            at += n
        ids_t = torch.cat(ids).to(self.device)
        codes_t = torch.cat(codes).to(self.device)
        if dec_pos:
            codes_t[torch.tensor(dec_pos, device=self.device)] = self.hist[
                torch.tensor(dec_slot, device=self.device), torch.tensor(dec_step, device=self.device)
            ]
        return self.model.embed_rows(ids_t, codes_t)

    def row_key(self, req: Request, start: int, end: int) -> bytes | None:
        """Prefix-cache content key of rows ``start .. end``: their codes ``[n, N]`` as int64 bytes when any
        is an audio row (reference or generated), else ``None`` (plain text rows: the ids say it all)."""
        p = req.num_prompt
        prompt: HiggsPrompt = req.extra["prompt"]
        parts = []
        if start < p:
            c = prompt.codes[start : min(end, p)]
            if bool((c >= 0).any()) or end > p:
                parts.append(c)
        if end > p:
            parts.append(self._hist_rows(req, max(start, p) - p, end - p).cpu())
        return tensor_bytes(torch.cat(parts)) if parts else None

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        return self.model(x, batch, kv)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.codebook_logits(hidden)

    def decode(self, reqs: list[Request], hidden: torch.Tensor) -> tuple[list[int], list[bool], list[dict]]:
        """One step of every sampled row: ``N`` codes each, the rules, the completed frames."""
        self._sync()  # on a GPU, charge the forward's kernels to the forward, not to the counters below
        t0 = time.perf_counter()
        logits = self.model.codebook_logits(hidden)
        self._sync()
        t1 = time.perf_counter()
        drawn = self.sample_seconds
        out = self._decode_batched(reqs, logits) if self.lever else self._decode_loop(reqs, logits)
        self.head_seconds += t1 - t0
        self.state_seconds += time.perf_counter() - t1 - (self.sample_seconds - drawn)
        self.decode_steps += 1
        return out

    # -- the lever: one batched state update -----------------------------------------------------------
    def _decode_batched(self, reqs, logits):
        cfg, n = self.cfg, self.n
        slots = torch.tensor([r.slot for r in reqs], device=self.device)
        ints, floats = self.ints[slots], self.floats[slots]
        steps, eoc, max_tokens, ignore = ints[:, 0], ints[:, 1], ints[:, 3], ints[:, 4].bool()
        logits[:, :, cfg.eoc_id].masked_fill_(ignore[:, None], float("-inf"))
        per_code = ints[:, 5:].repeat_interleave(n, dim=0)  # [B·N, 2]: top_k, seed
        fl = floats.repeat_interleave(n, dim=0)
        counters = (steps[:, None] * n + self.cb).reshape(-1)
        sb = SamplingBatch(
            fl[:, 0], per_code[:, 0], fl[:, 1], self._ones(fl.shape[0]), per_code[:, 1], counters
        )
        ts = time.perf_counter()
        codes = sample_inverse_cdf(logits.reshape(-1, cfg.vocab_size), sb).view(-1, n)
        self.sample_seconds += time.perf_counter() - ts
        boc, eoc_f = forced(self.rules, steps, eoc, n)
        codes = torch.where(boc, cfg.boc_id, torch.where(eoc_f, cfg.eoc_id, codes))
        new_eoc, ended, emits = advance(self.rules, codes, steps, eoc, cfg.eoc_id)
        finishing = ended | (steps + 1 >= max_tokens)
        self.hist[slots, steps] = codes
        self.ints[slots, :3] = torch.stack((steps + 1, new_eoc, finishing.long()), dim=1)
        rows = (steps - (n - 1))[:, None] + self.cb
        frame = self.hist[slots[:, None], rows.clamp(min=0), self.cb].clamp(0, cfg.boc_id - 1)
        flags = torch.stack((ended, finishing, emits), dim=1).to(torch.int64)
        out = torch.cat((flags, frame), dim=1).tolist()  # one host copy for the whole step
        toks = [ENDED if o[0] else 0 for o in out]
        extras = [{"codes": o[3:]} if o[2] else {} for o in out]
        return toks, [bool(o[1]) for o in out], extras

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _ones(self, k: int) -> torch.Tensor:
        if getattr(self, "_ones_buf", None) is None or self._ones_buf.shape[0] < k:
            self._ones_buf = torch.ones(max(k, 64), device=self.device)
        return self._ones_buf[:k]

    # -- lever off: the per-request loop ----------------------------------------------------------------
    def _decode_loop(self, reqs, logits):
        cfg, n = self.cfg, self.n
        toks, fins, extras = [], [], []
        for k, req in enumerate(reqs):
            st, sp = req.extra["state"], req.sampling
            row = logits[k]
            if sp.ignore_eos:
                row[:, cfg.eoc_id] = float("-inf")
            one = torch.ones(n, device=self.device)
            sb = SamplingBatch(
                one * sp.temperature,
                (one * sp.top_k).long(),
                one * sp.top_p,
                one,
                (one * 0).long() + sp.seed,
                st["steps"] * n + self.cb,
            )
            ts = time.perf_counter()
            drawn = sample_inverse_cdf(row, sb).tolist()
            self.sample_seconds += time.perf_counter() - ts
            codes, st["eoc"], ended, emits = step_one(
                self.rules, drawn, st["steps"], st["eoc"], cfg.boc_id, cfg.eoc_id
            )
            st["hist"].append(codes)
            s = st["steps"]
            st["steps"] = s + 1
            fin = ended or s + 1 >= sp.max_tokens
            toks.append(ENDED if ended else 0)
            fins.append(fin)
            if emits:
                frame = [min(max(st["hist"][s - (n - 1) + i][i], 0), cfg.boc_id - 1) for i in range(n)]
                extras.append({"codes": frame})
            else:
                extras.append({})
        return toks, fins, extras
