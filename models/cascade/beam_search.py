"""Beam search over an autoregressive decoder that keeps its own KV cache (the ASR decoders of the cascade).

The search is the one Whisper's reference decoder uses (Radford et al. 2022, "Robust Speech Recognition via
Large-Scale Weak Supervision", §4.5 and ``whisper/decoding.py`` ``BeamSearchDecoder``): each step every live
hypothesis is extended by its ``beam`` most likely tokens; of all extensions the ``beam`` best by summed log
probability live on, and an extension by end-of-sequence is set aside as finished. The search stops when
``beam`` hypotheses have finished or the token cap is reached; the result is the finished (else live)
hypothesis with the best summed log probability divided by its length (Whisper's ranking without a length
penalty, which keeps short hypotheses from winning by having fewer terms).

The decoder is a callable that takes the last token of each live hypothesis and which earlier row each
hypothesis comes from (so it can gather its KV cache rows), and returns log probabilities. Nothing here
knows a model: :class:`~.moonshine.MoonshineASR` supplies its ONNX decoder step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

StepFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``step(tokens int64 [B], parents int64 [B]) -> log_probs float [B, vocab]``: row ``b`` continues the
hypothesis that was row ``parents[b]`` of the previous call (the KV cache rows are gathered by it)."""


@dataclass(frozen=True)
class Hypothesis:
    """A decoded sequence: its ``ids`` (end-of-sequence excluded) and summed log probability ``logprob``
    (end-of-sequence included when ``finished``)."""

    ids: tuple[int, ...]
    logprob: float
    finished: bool

    @property
    def rank(self) -> float:
        """``logprob`` per token (the end-of-sequence counted): what hypotheses are ranked by."""
        return self.logprob / (len(self.ids) + int(self.finished))


def beam_search(
    step: StepFn, first_log_probs: np.ndarray, eos_id: int, beam: int, max_tokens: int, patience: float = 1.0
) -> Hypothesis:
    """The best hypothesis of a beam search (see the module docstring).

    Args:
        step: the decoder's continuation (:data:`StepFn`); it is called with ``B ≤ beam`` rows.
        first_log_probs: float ``[vocab]``: log probabilities of the first token (the decoder run on its
            start token, batch 1: row 0 is the parent of every first-step hypothesis).
        eos_id: the end-of-sequence token id.
        beam: hypotheses kept per step (≥ 1; 1 is greedy decoding).
        max_tokens: most tokens per hypothesis, end-of-sequence not counted (≥ 1).
        patience: the search stops once ``round(beam * patience)`` hypotheses have finished (Kasai et al.
            2022, "Beam Decoding with Controlled Patience", arXiv:2204.05424; Whisper's ``--patience``);
            1.0 is the classic stopping rule.

    Returns:
        The best :class:`Hypothesis` by :attr:`Hypothesis.rank`.

    Raises:
        ValueError: ``beam`` or ``max_tokens`` below 1, ``patience`` below 1, or ``first_log_probs`` not 1-D.
    """
    if beam < 1 or max_tokens < 1:
        raise ValueError(f"beam and max_tokens must be >= 1, got {beam} and {max_tokens}")
    if patience < 1.0:
        raise ValueError(f"patience must be >= 1.0, got {patience}")
    enough = max(1, round(beam * patience))
    if first_log_probs.ndim != 1:
        raise ValueError(f"first_log_probs must be [vocab], got shape {first_log_probs.shape}")
    live = [Hypothesis((), 0.0, False)]
    finished: list[Hypothesis] = []
    log_probs = first_log_probs[None]
    for n in range(max_tokens):
        # every live row's `beam` best tokens, then the `beam` best extensions overall (stable order)
        top = np.argsort(-log_probs, axis=-1, kind="stable")[:, :beam]
        cands = sorted(
            ((h.logprob + float(log_probs[r, t]), r, int(t)) for r, h in enumerate(live) for t in top[r]),
            key=lambda c: -c[0],
        )
        kept: list[Hypothesis] = []
        parents: list[int] = []
        for logprob, r, t in cands:
            if t == eos_id:
                finished.append(Hypothesis(live[r].ids, logprob, True))
            else:
                kept.append(Hypothesis((*live[r].ids, t), logprob, False))
                parents.append(r)
            if len(kept) == beam:
                break
        live = kept
        if len(finished) >= enough or not live or n == max_tokens - 1:
            break
        log_probs = step(np.array([h.ids[-1] for h in live], np.int64), np.array(parents, np.int64))
    return max(finished or live, key=lambda h: h.rank)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``log(softmax(logits))`` over the last axis, in float64 (float ``[..., vocab]`` in)."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
