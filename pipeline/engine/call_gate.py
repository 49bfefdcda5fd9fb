"""The calibrated call decision: whether a reply offered tools (``tool_choice: auto``) starts with a call.

Greedy decoding decides "call or answer" by the single most likely first token, which is a poor rule: the
probability of calling is spread over several tokens that open a call (a code fence, ``{"``, ``<tool_call>``)
and the text's over many words, so the argmax calls at a call probability of 0.17 for one request and
answers in words at 0.42 for another (Qwen2.5-Coder-1.5B on ``bench tools``: it called a tool for "What do
you call frozen water?" and answered "Where is my order? The number is 48213." itself). The gate decides on
the whole mass instead, at the reply's first sampled token:

``p_call`` = the softmax probability (temperature 1, the model's own distribution, before any sampling
filter) of the ids whose text can open a call (:func:`call_start_ids`); if ``p_call >= threshold`` only
the ids whose text holds a whole opener (``<tool_call>``, a code fence: the grammar then forces a
well-formed call; a partial opener such as ``<`` let the model write ``<tools>`` as words) may be sampled,
else none of the call-opening ids may, nor one a spoken reply never starts with (whitespace: the model would
open its call after it; ``{``, ``[``, ``<`` or a backtick: Qwen2.5-Coder-1.5B began "What do you call frozen
water?" with ``{{`` and wrote a call after it), and the reply starts with a word. A threshold is a
calibration of one model: ``bench tools --call-threshold`` prints the trade-off (right calls against
spurious ones) per threshold, and ``MODELS.md`` ("Tool calling") gives the curve that chose
:data:`DEFAULT_CALL_THRESHOLD`. The decision is deterministic under sampling too: the words are sampled,
whether to call is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from omniduplex.models.cascade.tool_prompt import BARE_PREFIX, CALL_OPEN, FENCE

CALL_TRIGGERS = (CALL_OPEN, BARE_PREFIX, FENCE)
"""Texts that open a call under the ``auto`` grammar (:mod:`.grammar`: tagged, bare, fenced)."""
MARKUP_FIRST = "{[<`"
"""First characters of markup (JSON, a list, a tag, code) that a reply in words never starts with."""
DEFAULT_CALL_THRESHOLD = 0.35
"""The LLM stage's default ``call_threshold``: on Qwen2.5-Coder-1.5B (``bench tools --text``, 24 requests
that need a tool, 8 that do not) the no-tool requests' ``p_call`` reached 0.29-0.31 and 21 of the 24 tool
requests' lay above 0.35, with the system prompt's date in one line or with :func:`~omniduplex.pipeline.text.
spoken.date_context`; the 0.5B's calls do not separate by any threshold (figures in ``MODELS.md``)."""


def call_start_ids(
    decoded_vocab: list[bytes], triggers: tuple[str, ...] = CALL_TRIGGERS
) -> tuple[list[int], list[int], list[int]]:
    """``(start, whole, no_first)`` ids of a vocabulary: ``start`` the tokens that can open a call (their
    text, whitespace removed, is a non-empty prefix of a trigger or starts with one: ``"`"``, ``"{"`` and a
    newline, ``"```"``, ``"```json"``, ``' {"'``, ``"<tool_call>"``), ``whole`` those of them that hold a
    whole trigger (``"```"``, ``"<tool_call>"``), ``no_first`` the tokens a spoken reply does not start with:
    whitespace only, or markup whose first character is one of :data:`MARKUP_FIRST` (``"{{"``, ``"{}"``,
    ``"["``, ``"<"``).

    Args:
        decoded_vocab: each id's text as UTF-8 bytes (xgrammar's ``TokenizerInfo.decoded_vocab``); ids
            whose bytes are not valid UTF-8 on their own (parts of a multi-byte character) are none of these.
    """
    start, whole, no_first = [], [], []
    bare = [re.sub(r"\s", "", t) for t in triggers]
    for i, raw in enumerate(decoded_vocab):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text and (not text.strip() or text.lstrip()[0] in MARKUP_FIRST):
            no_first.append(i)
        text = re.sub(r"\s", "", text)  # the parser reads a call written with any spacing ('{\n"name"')
        if text and any(t.startswith(text) or text.startswith(t) for t in bare):
            start.append(i)
            if any(text.startswith(t) for t in bare):
                whole.append(i)
    return start, whole, no_first


@dataclass(frozen=True, eq=False)
class CallGate:
    """The decision rule of the module docstring for one vocabulary.

    Attributes:
        start_ids: int64 ``[N]``, the ids that can open a call (:func:`call_start_ids`).
        threshold: the ``p_call`` (0..1) from which the reply calls.
        whole_ids: int64 ``[W]``, the ids of ``start_ids`` that hold a whole opener (sampled when the reply
            calls; empty: all of ``start_ids``).
        no_first_ids: int64 ``[K]``, whitespace-only and markup-opening ids (not sampled first when the reply
            is words).
    """

    start_ids: torch.Tensor
    threshold: float
    whole_ids: torch.Tensor = torch.zeros(0, dtype=torch.int64)
    no_first_ids: torch.Tensor = torch.zeros(0, dtype=torch.int64)

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"call_threshold must be in [0, 1], got {self.threshold}")
        for name in ("start_ids", "whole_ids", "no_first_ids"):
            ids = getattr(self, name)
            if ids.dtype != torch.int64 or ids.dim() != 1:
                raise ValueError(f"{name} must be an int64 [N] tensor")
        if not len(self.start_ids):
            raise ValueError("start_ids must not be empty")

    def p_call(self, row: torch.Tensor) -> float:
        """``p_call`` of one logits row (``[V]``, any float dtype)."""
        return float(row.float().softmax(-1)[self.start_ids.to(row.device)].sum())

    def decide_(self, row: torch.Tensor) -> bool:
        """Apply the decision to a logits row ``[V]`` in place (the ids of the other side set to ``-inf``);
        whether the reply calls."""
        start = self.start_ids.to(row.device)
        calls = self.p_call(row) >= self.threshold
        if calls:
            ids = self.whole_ids.to(row.device) if len(self.whole_ids) else start
            keep = row[ids].clone()
            row.fill_(float("-inf"))
            row[ids] = keep
        else:
            row[start] = float("-inf")
            row[self.no_first_ids.to(row.device)] = float("-inf")
        return calls
