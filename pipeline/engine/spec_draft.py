"""The draft model of speculative decoding (``method: draft``, :mod:`.speculative`): a smaller LM of the
target's vocabulary on an engine of its own.

A shadow request per speculating target request holds the target's prompt and emitted ids; each step it
is brought up to the target's ids (its KV cut back where its own drafts were rejected:
:meth:`.scheduler.Scheduler.rollback`), catches up in one prefill chunk and samples up to ``k`` ids, one
batched draft step per id, with the target's temperature / top-k / top-p and a seed derived from the
target's, so the distribution ``q`` each draft was drawn from is known to the verification
(:mod:`.spec_verify`). The draft engine shares full blocks of common prefixes (a system prompt) as the
target's does.
"""

from __future__ import annotations

import torch

from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.spec_verify import target_probs


class DraftAdapter(DecoderLMAdapter):
    """A :class:`DecoderLMAdapter` keeping its last :meth:`compute_logits` output (the draft's ``q``)."""

    last_logits: torch.Tensor | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.last_logits = super().compute_logits(hidden)
        return self.last_logits


def draft_seed(seed: int) -> int:
    """The shadow request's seed: derived from the target's, never equal to it (independent noise)."""
    return (seed * 6364136223846793005 + 1442695040888963407) % (1 << 62)


class DraftModel:
    """A draft LM on an engine of its own, mirroring the target's speculating requests.

    Args:
        model: the draft :class:`~omniduplex.models.decoder_lm.DecoderLM` (same vocabulary as the target).
        k: most draft ids a step.
        num_blocks, max_num_seqs, max_num_batched_tokens, dtype, device: its engine's sizes (the target's).
    """

    def __init__(
        self, model, k: int, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, dtype, device
    ) -> None:
        self.adapter = DraftAdapter(model)
        self.k = k
        self.engine = Engine(
            self.adapter,
            num_blocks + 2,  # a shadow runs up to k + 1 ids past its target's budget
            max_num_seqs,
            max_num_batched_tokens,
            dtype=dtype,
            device=device,
            adapt_threads=False,
            name="draft",
        )
        self.shadows: dict[str, Request] = {}

    def _shadow(self, req: Request) -> Request | None:
        """The shadow of ``req``, made or brought up to ``req``'s ids (its KV cut where they differ)."""
        sh = self.shadows.get(req.request_id)
        if sh is not None and sh.status.finished:
            del self.shadows[req.request_id]
            sh = None
        if sh is None:
            sp = req.sampling
            params = SamplingParams(
                temperature=sp.temperature,
                top_k=sp.top_k,
                top_p=sp.top_p,
                max_tokens=sp.max_tokens + self.k + 2,
                seed=draft_seed(int(sp.seed)),
            )
            sh = Request(req.request_id, list(req.prompt_ids), params)
            sh.output_ids = list(req.output_ids)
            try:
                self.engine.add_request(sh)
            except ValueError:
                return None
            self.shadows[req.request_id] = sh
            return sh
        out, target = sh.output_ids, req.output_ids
        common = 0
        for a, b in zip(out, target):
            if a != b:
                break
            common += 1
        del out[common:]
        out.extend(target[common:])
        del sh.block_hashes[(sh.num_prompt + common) // BLOCK_SIZE :]  # hashes of rows that changed
        valid = min(sh.num_computed, sh.num_prompt + common, sh.num_inputs - 1)
        if valid < sh.num_computed:
            sh.num_computed = valid
            self.engine.scheduler.rollback(sh)
        return sh

    def release(self, request_id: str) -> None:
        """Drop the shadow of a finished / aborted request (its KV blocks freed)."""
        if self.shadows.pop(request_id, None) is not None:
            self.engine.abort(request_id)

    def propose(self, cands: list[tuple[Request, int]]) -> None:
        """Set ``draft_ids`` (and, for sampled requests, ``draft_probs`` float64 ``[k, V]``) of each
        ``(request, k)``: up to ``k`` rounds of the draft engine, one id per shadow a round."""
        live: dict[str, tuple[Request, int]] = {}
        for req, k in cands:
            if self._shadow(req) is not None:
                live[req.request_id] = (req, k)
        for rid in [r for r in self.shadows if r not in live]:
            self.release(rid)
        probs: dict[str, list[torch.Tensor]] = {rid: [] for rid in live}
        for _ in range(max((k for _, k in live.values()), default=0)):
            outs = self.engine.step()
            if not outs:
                continue
            logits = self.adapter.last_logits
            for i, o in enumerate(outs):
                req, k = live[o.request_id]
                if len(req.draft_ids) >= k:
                    continue
                req.draft_ids.append(o.new_token_ids[0])
                if req.sampling.temperature > 0:
                    probs[o.request_id].append(target_probs(logits[i : i + 1], req.sampling)[0].cpu())
            if all(len(req.draft_ids) >= k for req, k in live.values()):
                break
        for rid, rows in probs.items():
            if rows:
                live[rid][0].draft_probs = torch.stack(rows)
