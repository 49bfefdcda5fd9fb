"""Higgs' delay-pattern decode rules: which codes are forced at a step, when the clip ends, which frame a
step completes. Two forms with the same results: batched tensor functions over ``B`` requests (the serving
path) and a plain-Python one-request form (:func:`step_one`, the per-request loop it replaces).

Codebook ``i`` runs ``i`` steps behind codebook 0 (MusicGen delay pattern, Copet et al. 2023;
:mod:`omniduplex.models.unified.delay_pattern`): before its first code it emits BOC, and frame ``f`` is
complete once codebook ``N − 1`` has emitted it. State per request: ``steps`` (steps sampled so far) and
``eoc`` (the end countdown, ``−1`` before the end begins).

Two rule sets (:data:`TRANSFORMERS`, :data:`V3`):

- ``transformers``: ``transformers`` 5.19 ``HiggsAudioV2GenerationMixin._sample`` with
  ``HiggsAudioV2DelayPatternLogitsProcessor`` (the prompt ends with the audio-start token). Step 0 is an
  all-BOC frame (``lead`` 1: codebook ``i`` is forced to BOC while ``i > steps − 1``). Any codebook's EOC
  starts the end; ``j`` steps later EOC is forced on codebooks ``0 .. j − 1``; a frame of all EOC ends the
  clip and is not a frame of audio.
- ``v3``: Higgs Audio v3 serving (sglang-omni ``higgs_tts/sampler.py``, the stack Boson's v3 model card
  recommends): the prompt's ``<|audio|>`` is followed directly by codebook 0's first code (``lead`` 0:
  codebook ``i`` is BOC while ``i > steps``); once the ``N``-step delay window is over, codebook 0's EOC
  starts an ``N − 2``-step countdown whose last step still completes the last frame; nothing is forced.

Frames (both): step ``s`` completes frame ``s − lead − (N − 1)`` (when ``>= 0``): codebook ``i`` of frame
``f`` is the code it emitted at step ``f + lead + i``. Codes are clipped to ``[0, BOC)`` for the codec,
as ``HiggsAudioV2Processor.batch_decode`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniduplex.models.unified.delay_pattern import step_validity


@dataclass(frozen=True)
class DelayRules:
    """One rule set (module docstring). ``lead``: all-BOC frames before codebook 0 starts; ``any_eoc_ends``:
    the ``transformers`` end (any EOC triggers, EOC forced, all-EOC frame ends) instead of ``v3``'s."""

    name: str
    lead: int
    any_eoc_ends: bool


TRANSFORMERS = DelayRules("transformers", lead=1, any_eoc_ends=True)
V3 = DelayRules("v3", lead=0, any_eoc_ends=False)
RULES = {r.name: r for r in (TRANSFORMERS, V3)}


def forced(
    rules: DelayRules, steps: torch.Tensor, eoc: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codebooks forced to BOC and to EOC at this step: bool ``[B, N]`` each, from int64 ``steps`` and
    ``eoc`` ``[B]``."""
    boc = ~step_validity(steps - rules.lead, n)
    if not rules.any_eoc_ends:
        return boc, torch.zeros_like(boc)
    cb = torch.arange(n, device=steps.device)
    return boc, (eoc[:, None] >= 0) & (cb[None, :] <= eoc[:, None]) & ~boc


def advance(
    rules: DelayRules, codes: torch.Tensor, steps: torch.Tensor, eoc: torch.Tensor, eoc_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """After the step's codes ``[B, N]`` (forcing applied): ``(new eoc [B], ended [B], emits [B])``.

    ``ended``: the clip ends at this step (the request stops); ``emits``: this step completes a frame of
    audio (frame ``steps − lead − (N − 1)``).
    """
    n = codes.shape[1]
    is_eoc = codes == eoc_id
    if rules.any_eoc_ends:
        ended = is_eoc.all(dim=1)
        new = torch.where(eoc >= 0, eoc + 1, torch.where(is_eoc.any(dim=1), 0, -1))
    else:
        after = steps >= n  # the delay window (the first N steps) is over
        counting = after & (eoc >= 0)
        trigger = after & (eoc < 0) & is_eoc[:, 0]
        new = torch.where(counting, eoc - 1, torch.where(trigger, n - 2, eoc))
        ended = (counting & (eoc - 1 <= 0)) | (trigger & (n <= 2))
    emits = steps - rules.lead - (n - 1) >= 0
    if rules.any_eoc_ends:
        emits = emits & ~ended
    return new, ended, emits


def step_one(rules: DelayRules, codes: list[int], step: int, eoc: int, boc_id: int, eoc_id: int):
    """One request's step in plain Python: ``codes`` (the sampled ``N`` ids, before forcing) →
    ``(codes after forcing, new eoc, ended, emits)``; the same rules as :func:`forced` + :func:`advance`."""
    n = len(codes)
    started = [i <= step - rules.lead for i in range(n)]
    codes = [c if ok else boc_id for c, ok in zip(codes, started)]
    if rules.any_eoc_ends:
        if eoc >= 0:  # (a codebook that has not started is never forced to end: BOC wins, as in forced())
            codes = [eoc_id if i <= eoc and started[i] else c for i, c in enumerate(codes)]
        ended = all(c == eoc_id for c in codes)
        new = eoc + 1 if eoc >= 0 else (0 if eoc_id in codes else -1)
    else:
        new, ended = eoc, False
        if step >= n and eoc >= 0:
            new = eoc - 1
            ended = new <= 0
        elif step >= n and codes[0] == eoc_id:
            new, ended = (n - 2, False) if n > 2 else (eoc, True)
    emits = step - rules.lead - (n - 1) >= 0 and not (rules.any_eoc_ends and ended)
    return codes, new, ended, emits
