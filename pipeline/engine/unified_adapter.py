"""Engine adapter of the unified delay-pattern LM: primary–auxiliary decoding and CFG pairs.

Stream 0 is the primary token the scheduler sees (``Request.output_ids``); streams ``1..S-1`` are
sampled in the same step from ``logits_i = W_H(h + e_i)`` and kept in a batched step buffer. Every
request's decode state — phase, phase counter, frames, budgets, audio start, step tokens — lives in
tensors indexed by the request's slot, and one step runs the phase rules of
:mod:`omniduplex.models.unified.phases` over the whole batch at once.

CFG: a request with ``extra["cfg_scale"] = w > 1`` gets a hidden companion on the null prompt (see
:meth:`UnifiedAdapter.make_request`). The companion is lazy: through TEXT and TRANSITION (where its
logits are unused) it is not run, only handed the sampled steps; after the last bridge token it
catches up on all of them in one prefill chunk, in the same step as its main request. From then on
the scheduler keeps the pair in one batch, its two rows share this forward, their logits merge as
``w·cond + (1−w)·uncond`` in AUDIO/DRAIN, and the sampled step is appended to both.

The merge is computed on the final hidden states, before the head: the head is linear and bias-free,
so ``w·W(h_c + e_i) + (1−w)·W(h_u + e_i) = W(w·h_c + (1−w)·h_u + e_i)`` for every stream ``i``, and
companions never reach the LM head (the head's ``[2c, V]`` GEMM and the ``[c, V]`` merge become one
``[c, H]`` merge). Equal to the sequential reference's logit merge up to fp32 rounding.
"""

from __future__ import annotations

import torch

from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.unified.model import UnifiedLM, null_prompt_ids
from omniduplex.models.unified.phases import (
    AUDIO,
    DONE,
    DRAIN,
    PHASE_NAMES,
    TEXT,
    PhaseState,
    PhaseTables,
    assemble,
    cfg_active,
    merge_cfg,
    next_state,
    resolve_step,
)
from omniduplex.pipeline.engine.prefix_cache import tensor_bytes
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.sampler import counter_uniform


class UnifiedAdapter:
    """Adapter for :class:`UnifiedLM`. ``max_len``: longest request (prompt + steps) the buffers hold."""

    def __init__(self, model: UnifiedLM, max_len: int = 4096) -> None:
        self.model, self.cfg = model, model.cfg
        d = self.cfg.decoder
        self.num_layers, self.num_kv_heads, self.head_dim = (
            d.num_hidden_layers,
            d.num_key_value_heads,
            d.head_dim,
        )
        self.vocab_size, self.hidden_size = self.cfg.vocab_size, d.hidden_size
        self.max_position_embeddings = d.max_position_embeddings
        self.s = self.cfg.num_streams
        dev = model.lm_head.weight.device
        self.tables = PhaseTables.from_config(self.cfg, dev)
        self.offsets = torch.tensor([self.cfg.stream_offset(i) for i in range(self.s)], device=dev)
        self.max_len = max_len
        self.cap = 0
        self.state = PhaseState.initial(0, 0, 0, dev)
        self.audio_start = torch.zeros(0, dtype=torch.int64, device=dev)
        self.steps = torch.zeros((0, max_len, self.s), dtype=torch.int64, device=dev)

    # -- requests ------------------------------------------------------------------------------------
    def make_request(
        self,
        request_id: str,
        prompt_ids: list[int] | torch.Tensor,
        max_text_tokens: int,
        max_audio_frames: int,
        cfg_scale: float = 1.0,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Request:
        """A request for :meth:`Engine.add_request` (with its null-prompt companion if ``cfg_scale != 1``).

        ``prompt_ids``: text ids ``[P]``, or step tokens int64 ``[P, S]`` (``-1`` = absent) for prompts
        with speech (:mod:`omniduplex.models.unified.prompt`); the scheduler sees their stream-0 column.

        Raises:
            ValueError: a ``[P, S]`` prompt with the wrong stream count or an absent stream-0 token.
        """
        steps = None
        if isinstance(prompt_ids, torch.Tensor) and prompt_ids.dim() == 2:
            if prompt_ids.shape[1] != self.s or bool((prompt_ids[:, 0] < 0).any()):
                raise ValueError(f"prompt steps must be [P, S={self.s}] with a stream-0 token in every step")
            steps = prompt_ids.to(torch.int64)
            prompt_ids = steps[:, 0].tolist()
        budget = max_text_tokens + len(self.cfg.bridge_token_ids) + max_audio_frames + self.s
        sp = dict(temperature=temperature, max_tokens=budget, seed=seed)
        extra = {"max_text": max_text_tokens, "max_frames": max_audio_frames, "cfg_scale": cfg_scale}
        comp = None
        if cfg_scale != 1.0:
            comp = Request(
                f"{request_id}#cfg", null_prompt_ids(self.cfg), SamplingParams(**sp), extra=dict(extra)
            )
        main_extra = extra if steps is None else {**extra, "prompt_steps": steps}
        req = Request(request_id, list(prompt_ids), SamplingParams(**sp), extra=main_extra, companion=comp)
        req.companion_live = comp is None  # the companion's logits matter from AUDIO on (cfg_active)
        return req

    def on_added(self, req: Request) -> None:
        """Reset the slot state of ``req`` (and its companion)."""
        for r in req.group:
            self._ensure(r.slot)
            i = r.slot
            self.state.phase[i] = TEXT
            self.state.count[i] = 0
            self.state.frames[i] = 0
            self.state.max_text[i] = r.extra["max_text"]
            self.state.max_frames[i] = r.extra["max_frames"]
            self.audio_start[i] = -1
            self.steps[i].fill_(-1)

    def _ensure(self, slot: int) -> None:
        if slot < self.cap:
            return
        grow = max(8, self.cap, slot + 1 - self.cap)
        st = self.state
        z = torch.zeros(grow, dtype=torch.int64, device=st.phase.device)
        self.state = PhaseState(
            *(torch.cat((t, z)) for t in (st.phase, st.count, st.frames, st.max_text, st.max_frames))
        )
        self.audio_start = torch.cat((self.audio_start, z - 1))
        self.steps = torch.cat((self.steps, self.steps.new_full((grow, self.max_len, self.s), -1)))
        self.cap += grow

    # -- engine hooks --------------------------------------------------------------------------------
    def input_embeds(self, items: list[tuple[Request, int]]) -> torch.Tensor:
        rows = []
        for req, n in items:
            s, p = req.num_computed, req.num_prompt
            if s < p:
                if "prompt_steps" in req.extra:
                    rows.append(req.extra["prompt_steps"][s : min(s + n, p)].to(self.steps.device))
                else:
                    ids = torch.tensor(req.prompt_ids[s : min(s + n, p)], device=self.steps.device)
                    rows.append(
                        torch.cat((ids[:, None], ids.new_full((ids.shape[0], self.s - 1), -1)), dim=1)
                    )
            if s + n > p:
                rows.append(self.steps[req.slot, max(s, p) - p : s + n - p])
        return self.model.embed_step(torch.cat(rows))

    def row_key(self, req: Request, start: int, end: int) -> bytes:
        """Prefix-cache content key of input rows ``start..end``: their step tokens ``[n, S]`` (every stream,
        not only the stream-0 ids the chain hash already covers), as int64 bytes."""
        s, p = start, req.num_prompt
        parts = []
        if s < p and "prompt_steps" in req.extra:
            parts.append(req.extra["prompt_steps"][s : min(end, p)])
        if end > p:
            parts.append(self.steps[req.slot, max(s, p) - p : end - p])
        return tensor_bytes(torch.cat([t.to(torch.int64).cpu() for t in parts])) if parts else b""

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        return self.model(x, batch, kv)

    def decode_forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        """The pure forward a decode step's CUDA graph captures (:mod:`.decode_graphs`)."""
        return self.model(x, batch, kv)

    def decode(self, reqs: list[Request], hidden: torch.Tensor) -> tuple[list[int], list[bool], list[dict]]:
        """One step of every sampled row: CFG merge (on hidden states), phase rules, per-request seeded
        sampling, buffers.

        Works on the compact logits of :meth:`UnifiedLM.decode_logits` (stream 0 over the vocabulary,
        streams ``1..S-1`` over their own region), never on ``[B, S, V]``.
        """
        dev = hidden.device
        main_rows = [i for i, r in enumerate(reqs) if not r.is_companion]
        mains = [reqs[i] for i in main_rows]
        slots = torch.tensor([r.slot for r in mains], device=dev)
        pos = {id(r): i for i, r in enumerate(reqs)}
        comp_rows = [pos.get(id(r.companion), pos[id(r)]) for r in mains]
        scale = torch.tensor(
            [r.extra["cfg_scale"] if r.companion is not None else 1.0 for r in mains], device=dev
        )
        state = PhaseState(
            *(
                t[slots]
                for t in (
                    self.state.phase,
                    self.state.count,
                    self.state.frames,
                    self.state.max_text,
                    self.state.max_frames,
                )
            )
        )
        h = hidden[main_rows]
        active = cfg_active(state) & (scale != 1.0)
        if bool(active.any()):
            h = merge_cfg(h, hidden[comp_rows], scale, active).to(h.dtype)
        p, x = self.model.decode_logits(h)  # [B, V], [B, S-1, A]: companions never reach the LM head
        step = resolve_step(state, p.argmax(-1), self.tables)
        allow0 = self.tables.allowed[step.phase, 0]  # [B, V]
        s0 = self._pick(p.masked_fill(~allow0, float("-inf"))[:, None], mains, 0)[:, 0]
        codes = self._pick(x[..., : self.cfg.codebook_size], mains, 1) + self.offsets[None, 1:]
        tokens = assemble(step, torch.cat((s0[:, None], codes), dim=1), self.tables)
        new = next_state(step, tokens, self.tables)
        # write back the state of mains and companions (a companion mirrors its main)
        n_done = torch.tensor([len(r.output_ids) for r in mains], device=dev)
        became_audio = (step.phase == AUDIO) & (self.audio_start[slots] < 0)
        audio_start = torch.where(became_audio, n_done, self.audio_start[slots])
        comp_of = [k for k, r in enumerate(mains) if r.companion is not None]
        idx = torch.cat(
            (slots, torch.tensor([mains[k].companion.slot for k in comp_of], dtype=torch.int64, device=dev))
        )
        rep = torch.cat(
            (torch.arange(len(mains), device=dev), torch.tensor(comp_of, dtype=torch.int64, device=dev))
        )
        for dst, src in zip(
            (self.state.phase, self.state.count, self.state.frames), (new.phase, new.count, new.frames)
        ):
            dst[idx] = src[rep]
        self.audio_start[idx] = audio_start[rep]
        self.steps[idx, n_done[rep]] = tokens[rep]
        frame, has_frame = self._completed_frames(step, slots, audio_start)
        return self._outputs(reqs, mains, step, tokens, new, frame, has_frame)

    @staticmethod
    def _outputs(reqs, mains, step, tokens, new, frame, has_frame):
        tok0, finished, phases = tokens[:, 0].tolist(), (new.phase == DONE).tolist(), step.phase.tolist()
        live = cfg_active(new).tolist()
        tok_rows, frame_rows, has = tokens.tolist(), frame.tolist(), has_frame.tolist()
        by_req = {}
        for k, r in enumerate(mains):
            extra = {"phase": PHASE_NAMES[phases[k]], "step": tok_rows[k]}
            if phases[k] == TEXT:
                extra["text_token"] = tok0[k]
            if has[k]:
                extra["codes"] = frame_rows[k]
            by_req[id(r)] = (tok0[k], finished[k], extra)
            if r.companion is not None:
                r.companion_live = r.companion_live or live[k]
                by_req[id(r.companion)] = (tok0[k], finished[k], {})
        out = [by_req[id(r)] for r in reqs]
        return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]

    def _pick(self, logits: torch.Tensor, mains: list[Request], first_stream: int) -> torch.Tensor:
        """``[B, M, K]`` → ids ``[B, M]``: argmax for greedy requests, else Gumbel-max with noise keyed by
        (seed, step, stream) so a request's draw never depends on its batch-mates."""
        greedy = logits.argmax(-1)
        temps = torch.tensor([r.sampling.temperature for r in mains], device=logits.device)
        if not bool((temps > 0).any()):
            return greedy
        b, m, k = logits.shape
        seeds = torch.tensor([r.sampling.seed for r in mains], device=logits.device).repeat_interleave(m)
        base = torch.tensor([len(r.output_ids) * self.s + first_stream for r in mains], device=logits.device)
        counters = (base[:, None] + torch.arange(m, device=logits.device)).reshape(-1)
        g = -torch.log(-torch.log(counter_uniform(seeds, counters, k))).view(b, m, k)
        t = torch.where(temps > 0, temps, torch.ones_like(temps))[:, None, None]
        drawn = (logits.double() / t + g).argmax(-1)
        return torch.where((temps > 0)[:, None], drawn, greedy)

    def _completed_frames(self, step: PhaseState, slots: torch.Tensor, audio_start: torch.Tensor):
        """Codebook ids ``[B, S]`` of the frame this step completes (delay pattern), and whether one did."""
        a = step.frames + torch.where(step.phase == DRAIN, step.count, 0)
        f = a - (self.s - 1)
        ok = ((step.phase == AUDIO) | (step.phase == DRAIN)) & (f >= 0)
        ar = torch.arange(self.s, device=slots.device)
        rows = (audio_start + f.clamp_min(0))[:, None] + ar[None, :]
        codes = (
            self.steps[slots[:, None], rows.clamp(0, self.max_len - 1), ar[None, :]] - self.offsets[None, :]
        )
        return codes, ok
