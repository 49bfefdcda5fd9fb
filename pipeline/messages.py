"""Typed messages between the orchestrator and the stages (the stage ↔ orchestrator contract).

A :class:`StageMessage` is what travels on an edge: a request id, a few named tensors, small JSON-able
metadata (its keys per message kind: :mod:`.edge_messages`) and a ``last`` flag closing that request's stream
on the edge. What a turn's consumer (CLI, session) sees: :mod:`.events`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StageMessage:
    """One chunk of a request's stream on a stage edge."""

    request_id: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    last: bool = False


def is_partial_transcript(msg: StageMessage) -> bool:
    """Whether ``msg`` is the ASR stage's partial transcript of a turn still being spoken (meta
    ``partial_transcript``, ``last=False``): it goes to the orchestrator (captions), and downstream only as a
    prefill hint (:func:`goes_downstream`)."""
    return not msg.last and "partial_transcript" in msg.meta


def goes_downstream(msg: StageMessage) -> bool:
    """Whether a stage's output ``msg`` goes to the next stage: everything but partial transcripts, and those
    too when they carry the turn's ``prefill`` context (the LLM stage's prefill hints)."""
    return not is_partial_transcript(msg) or "prefill" in msg.meta
