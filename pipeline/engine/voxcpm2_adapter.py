"""VoxCPM2 on the engine: both LMs on the paged KV cache, the flow-matching tail batched across requests.

Rows: a request's prompt rows are ``prompt_embeds`` (text or patch embeddings, ``req.extra["audio"]`` marks
the patch rows); each decode row is the previous patch's LocEnc embedding (``decode_embeds``).

KV: the base LM (MiniCPM4) and the residual LM both run on the engine's paged cache, layers
``0 .. L_base − 1`` and ``L_base .. L_base + L_res − 1`` of one allocation: both see exactly the same rows
(one per prompt row, one per patch), so they share the block table, positions and slot mapping, and
continuous batching, preemption and prefix caching (a voice's reference prefix) cover both. One
forward runs the base LM over the flat batch, applies the FSQ on patch rows, fuses each row with its patch
embedding (``fusion_concat_proj``) and runs the residual LM over the same batch; the hidden state handed back
per row is ``[lm_hidden, res_hidden]`` ``[T, 2H]``.

Decode (:meth:`VoxCPM2Adapter.decode`, once per engine step, for every request whose row was the last
computed): the stop head reads ``lm_hidden``; the LocDiT's Euler solver
(:func:`~omniduplex.models.voxcpm2.cfm.solve`) turns each request's noise (its own seeded generator) into the
next patch, **all requests of the step in one solver call** (grouped by timestep count;
``batch_solver=False`` runs one call per request, the unbatched baseline); the LocEnc embeds the patches (one
call) as the next decode rows. ``solver_calls`` counts solver calls, ``decode_steps`` the steps that decoded.

A request's ``output_ids`` get one id per patch: 1 when the stop head ended it (its stop id), else 0.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.voxcpm2.cfm import solve
from omniduplex.models.voxcpm2.model import VoxCPM2Model
from omniduplex.pipeline.engine.request import Request

STOP_ID = 1
"""Output id of the patch the stop head ended a request on (0 otherwise)."""


class VoxCPM2Adapter:
    """:class:`~omniduplex.pipeline.engine.engine.ModelAdapter` of :class:`VoxCPM2Model` (module docstring).

    Per-request state in ``req.extra``: ``audio`` (bool ``[L]``), ``cond`` (``[P, D]`` previous patch),
    ``gen`` (``torch.Generator`` of the noise), ``cfg_value``, ``timesteps``, ``min_len``.
    """

    def __init__(self, lm: VoxCPM2Model, batch_solver: bool = True) -> None:
        self.lm, self.batch_solver = lm, batch_solver
        cfg = lm.cfg
        self.num_base = cfg.lm.decoder.num_hidden_layers
        self.num_layers = self.num_base + cfg.residual.decoder.num_hidden_layers
        self.num_kv_heads, self.head_dim = cfg.lm.decoder.num_key_value_heads, cfg.lm.decoder.head_dim
        self.vocab_size = cfg.lm.decoder.vocab_size
        self.hidden = cfg.hidden_size
        self.solver_calls = 0
        self.decode_steps = 0
        self._audio = torch.zeros(0, dtype=torch.bool)

    # -- engine hooks --------------------------------------------------------------------------------
    def input_embeds(self, items: list[tuple[Request, int]]) -> torch.Tensor:
        rows, mask = [], []
        for req, n in items:
            s, p = req.num_computed, req.num_prompt
            if s < p:
                e = min(s + n, p)
                rows.append(req.prompt_embeds[s:e])
                mask.append(req.extra["audio"][s:e])
            if s + n > p:
                tail = req.decode_embeds[max(s, p) - p : s + n - p]
                rows.append(torch.stack(tail))
                mask.append(torch.ones(len(tail), dtype=torch.bool))
        self._audio = torch.cat(mask)
        return torch.cat(rows)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        lm = self.lm
        h, _ = lm.base_lm(x, batch, kv[: self.num_base])
        audio = self._audio.to(h.device)[:, None]
        h = torch.where(audio, lm.fsq_layer(h), h)
        r = lm.fusion_concat_proj(torch.cat((h, torch.where(audio, x, torch.zeros_like(x))), dim=-1))
        r, _ = lm.residual_lm(r, batch, kv[self.num_base :])
        return torch.cat((h, r), dim=-1)

    def decode(self, reqs: list[Request], hidden: torch.Tensor) -> tuple[list[int], list[bool], list[dict]]:
        """One patch for each of ``reqs`` from their rows' ``[lm_hidden, res_hidden]`` ``[B, 2H]``."""
        lm = self.lm
        lm_h, res_h = hidden[:, : self.hidden], hidden[:, self.hidden :]
        stop = lm.stop(lm_h).tolist()
        mu = lm.dit_condition(lm_h, res_h)
        cond = torch.stack([r.extra["cond"] for r in reqs]).to(mu).transpose(1, 2)
        d, p = cond.shape[1], cond.shape[2]
        noise = torch.stack([torch.randn((d, p), generator=r.extra["gen"]) for r in reqs]).to(mu)
        cfg = torch.tensor([float(r.extra["cfg_value"]) for r in reqs], device=mu.device)
        patches = torch.empty_like(noise)
        self.decode_steps += 1
        groups: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(reqs):
            groups[int(r.extra["timesteps"])].append(i)
        mean_mode = lm.cfg.cfm.mean_mode
        for n, rows in groups.items():
            chunks = [rows] if self.batch_solver else [[i] for i in rows]
            for part in chunks:
                idx = torch.tensor(part, device=mu.device)
                patches[idx] = solve(lm.estimator, noise[idx], mu[idx], cond[idx], cfg[idx], n, mean_mode)
                self.solver_calls += 1
        patches = patches.transpose(1, 2).contiguous()  # [B, P, D]
        tokens, finishing, extras, live = [], [], [], []
        for i, r in enumerate(reqs):
            k = len(r.output_ids)  # patches before this one
            stopped = stop[i] and k > int(r.extra["min_len"]) and not r.sampling.ignore_eos
            fin = stopped or k + 1 >= r.sampling.max_tokens
            tokens.append(STOP_ID if stopped else 0)
            finishing.append(fin)
            extras.append({"latents": patches[i]})
            if not fin:
                live.append(i)
        if live:
            self._embed_next(reqs, patches, live)
        return tokens, finishing, extras

    def _embed_next(self, reqs: list[Request], patches: torch.Tensor, live: list[int]) -> None:
        """The live requests' next input rows: their new patches through the LocEnc (one call, or one per
        request without the batched tail)."""
        lm = self.lm
        chunks = [live] if self.batch_solver else [[i] for i in live]
        for part in chunks:
            emb = lm.enc_to_lm_proj(lm.feat_encoder(patches[part][:, None]))[:, 0]
            for k, i in enumerate(part):
                reqs[i].decode_embeds.append(emb[k])
                reqs[i].extra["cond"] = patches[i]
