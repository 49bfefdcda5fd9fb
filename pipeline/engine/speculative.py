"""Speculative decoding in the continuous-batching engine: draft ``k`` ids cheaply, let the target score them
in one forward, keep the longest prefix the target agrees with (:mod:`.spec_verify`).

Each step, before scheduling, :meth:`Speculator.propose` gives every eligible decoding request up to ``k``
draft ids (``req.draft_ids``). The scheduler plans such a request for its pending row plus its drafts (a
multi-token decode over the paged KV: the prefill path with past context), the engine verifies the
``1 + k`` logits rows (:meth:`Speculator.verify`), appends the emitted ids (1 to ``k + 1``) and rolls the
request's KV back to the rows it kept (:meth:`.scheduler.Scheduler.rollback`: the blocks of rejected rows
go back to the pool).

Two proposers:

* **prompt lookup** (``method: ngram``; Saxena 2023, "Prompt Lookup Decoding"; vLLM's ``ngram`` proposer):
  the last ``n`` ids of prompt + output (``n`` from ``ngram_max`` down to ``ngram_min``) are looked up in
  the earlier ids; the ids that followed their latest earlier occurrence are the draft. No model.
* **draft model** (``method: draft``): a smaller LM of the same vocabulary (Qwen2.5-0.5B for Qwen2.5-1.5B /
  3B) on an engine of its own (:class:`.spec_draft.DraftModel`): a shadow request per target request
  mirrors the target's ids, catches up on the ids the target emitted and samples ``k`` ids one batched step
  at a time
  (with the target's temperature / top-k / top-p, so the draft distribution ``q`` of each id is known).

Eligible requests: decoding (one pending row), room for at least one more id, no grammar (tool-call turns
decode one id a step: their matcher cannot take back rejected ids), no repetition penalty (its counts would
change within the drafted run), no CFG companion, no embedding inputs, ``req.speculate`` true, and an adapter
whose sampled ids produce no extras (``supports_speculation``).

Back-off: a request none of whose drafts were kept skips the next 1, 2, 4, then 8 steps' drafts (doubling
while the drafts keep failing, reset by a kept one): on a CPU a verify step of ``1 + k`` rows costs more than
a one-row decode step, so drafts that keep failing would slow the request down. Outputs never depend on it.

Counters: per request ``num_draft_tokens`` / ``num_accepted_tokens``; per speculator ``num_drafted``,
``num_accepted``, ``num_verified`` (requests verified, summed over steps) and ``num_emitted``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omniduplex.pipeline.engine.request import Request
from omniduplex.pipeline.engine.spec_verify import verify_greedy, verify_sampled

METHODS = ("ngram", "draft")
MAX_K = 16
MAX_BACKOFF = 8
"""Most steps a request skips drafting after drafts that all failed (see the module docstring)."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """``method`` (``ngram`` or ``draft``), ``k`` (draft ids a step, 1..16), ``draft`` (the draft model: a
    checkpoint folder or ``.gguf``; ``draft`` only), ``ngram_max`` / ``ngram_min`` (lookup n-gram lengths)."""

    method: str
    k: int = 4
    draft: str | None = None
    ngram_max: int = 3
    ngram_min: int = 1

    @classmethod
    def parse(cls, raw: object, where: str = "llm_speculative") -> SpeculativeConfig:
        """From a manifest / graph mapping such as ``{method: ngram, k: 4}`` or ``{method: draft, draft:
        DIR_OR_GGUF, k: 4}``.

        Raises:
            ValueError: not a mapping, an unknown key or method, ``k`` or an n-gram length out of range, a
                ``draft`` missing (``method: draft``) or given to ``ngram`` (the message names ``where``).
        """
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be a mapping like {{method: ngram, k: 4}}, not {raw!r}")
        unknown = sorted(set(raw) - {"method", "k", "draft", "ngram_max", "ngram_min"})
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (method, k, draft, ngram_max, ngram_min)")
        method = raw.get("method")
        if method not in METHODS:
            raise ValueError(f"{where}.method must be one of {', '.join(METHODS)}, not {method!r}")
        ints = {}
        for key, default, lo, hi in (("k", 4, 1, MAX_K), ("ngram_max", 3, 1, 16), ("ngram_min", 1, 1, 16)):
            v = raw.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{where}.{key} must be an integer in [{lo}, {hi}], not {v!r}")
            ints[key] = v
        if ints["ngram_min"] > ints["ngram_max"]:
            raise ValueError(f"{where}: ngram_min {ints['ngram_min']} > ngram_max {ints['ngram_max']}")
        draft = raw.get("draft")
        if method == "draft" and not (isinstance(draft, str) and draft):
            raise ValueError(f"{where}: method draft needs 'draft' (a checkpoint folder or .gguf file)")
        if method == "ngram" and draft is not None:
            raise ValueError(f"{where}: 'draft' is for method draft, not ngram")
        return cls(method, ints["k"], draft, ints["ngram_max"], ints["ngram_min"])


def ngram_propose(seq: list[int], k: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    """Prompt lookup: the (up to) ``k`` ids that followed the latest earlier occurrence of the last ``n`` ids
    of ``seq``, for the longest ``n`` in ``ngram_max .. ngram_min`` that occurs; ``[]`` when none does."""
    size = len(seq)
    if size < 2 or k <= 0:
        return []
    arr = np.asarray(seq, dtype=np.int64)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        # windows starting at 0 .. size - n - 1: every earlier occurrence, not the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == arr[size - n :]).all(axis=1))
        if hits.size:
            at = int(hits[-1]) + n
            return seq[at : at + k]
    return []


class Speculator:
    """The engine's speculative decoding (module docstring).

    Args:
        config: method and sizes.
        draft: the draft model (``method: draft``; a :class:`.spec_draft.DraftModel`: ``propose(cands)``
            sets the drafts of ``(request, k)`` pairs, ``release(request_id)``), else ``None``.
    """

    def __init__(self, config: SpeculativeConfig, draft=None) -> None:
        if (config.method == "draft") != (draft is not None):
            need = "needs a" if draft is None else "takes no"
            raise ValueError(f"speculative method {config.method!r} {need} draft model")
        self.config, self.draft = config, draft
        self.num_drafted = self.num_accepted = self.num_verified = self.num_emitted = 0
        self._backoff: dict[str, tuple[int, int]] = {}  # request id -> (steps left to skip, last back-off)

    @staticmethod
    def eligible(req: Request) -> bool:
        """Whether ``req`` may be given drafts this step (module docstring)."""
        sp = req.sampling
        return (
            req.speculate
            and req.num_pending == 1
            and req.num_computed >= req.num_prompt
            and sp.grammar is None
            and sp.repetition_penalty == 1.0
            and req.companion is None
            and not req.is_companion
            and not req.embed_inputs
        )

    def propose(self, running: list[Request]) -> None:
        """Give eligible requests of ``running`` their drafts (``req.draft_ids``; cleared on the others)."""
        cands = []
        for req in running:
            req.draft_ids, req.draft_probs = [], None
            skip, last = self._backoff.get(req.request_id, (0, 0))
            if skip > 0 and req.num_pending == 1:
                self._backoff[req.request_id] = (skip - 1, last)
                continue
            if self.eligible(req):
                k = min(self.config.k, req.sampling.max_tokens - len(req.output_ids) - 1)
                if k > 0:
                    cands.append((req, k))
        if self.draft is not None:
            self.draft.propose(cands)
            return
        c = self.config
        for req, k in cands:
            req.draft_ids = ngram_propose(req.prompt_ids + req.output_ids, k, c.ngram_max, c.ngram_min)

    def verify(self, adapter, items: list[tuple[Request, int, int]], hidden: torch.Tensor) -> list[list[int]]:
        """The emitted ids of each ``(request, first row, rows)`` (its pending row and ``rows - 1`` drafts at
        rows ``first ..`` of ``hidden`` ``[T, hidden]``); updates the acceptance counters and clears the
        drafts."""
        index = [i for _, first, n in items for i in range(first, first + n)]
        logits = adapter.compute_logits(hidden[index]).float()
        out, at = [], 0
        for req, _, n in items:
            rows = logits[at : at + n]
            at += n
            drafts, sp = req.draft_ids[: n - 1], req.sampling
            if sp.never_sampled:
                rows[:, list(sp.never_sampled)] = float("-inf")
            if sp.temperature == 0:
                emitted = verify_greedy(rows, drafts)
            else:
                q = None if req.draft_probs is None else req.draft_probs[: n - 1]
                emitted = verify_sampled(rows, drafts, q, sp, len(req.output_ids))
            req.num_draft_tokens += len(drafts)
            req.num_accepted_tokens += len(emitted) - 1
            if drafts and len(emitted) == 1:  # every draft failed: skip the next drafts, doubling
                last = self._backoff.get(req.request_id, (0, 0))[1]
                wait = min(MAX_BACKOFF, 2 * last or 1)
                self._backoff[req.request_id] = (wait, wait)
            elif drafts:
                self._backoff.pop(req.request_id, None)
            self.num_drafted += len(drafts)
            self.num_accepted += len(emitted) - 1
            self.num_verified += 1
            self.num_emitted += len(emitted)
            req.draft_ids, req.draft_probs = [], None
            out.append(emitted)
        return out

    def release(self, request_id: str) -> None:
        """A request finished or was aborted: drop its draft state."""
        self._backoff.pop(request_id, None)
        if self.draft is not None:
            self.draft.release(request_id)

    def stats(self) -> dict[str, int]:
        """``spec_draft_tokens`` / ``spec_accepted_tokens``: ids proposed / kept since the engine started."""
        return {"spec_draft_tokens": self.num_drafted, "spec_accepted_tokens": self.num_accepted}
