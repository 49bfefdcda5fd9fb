"""Typed messages between the orchestrator and the stages (the stage ↔ orchestrator contract).

A :class:`StageMessage` is what travels on an edge: a request id, a few named tensors, small JSON-able
metadata and a ``last`` flag closing that request's stream on the edge. Events are what a turn's
consumer (CLI, session) sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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


EventKind = Literal["transcript", "text", "tool_call", "audio", "done", "error"]


@dataclass
class TurnEvent:
    """Something a turn produced.

    ``transcript``: ``text`` is what the user said (ASR), ``words`` its ``[word, start_s, end_s]`` timings.
    ``text``: ``text`` holds a reply-text delta. ``audio``: ``pcm`` float32 ``[n]`` at the graph's output
    rate; ``text`` the words those samples speak, when the audio stage knows them (cascade TTS), else "".
    ``done``: the turn finished; ``metrics`` has ``ttfp_ms``, ``e2el_ms``, ``rtf``, ``audio_s`` (and, for
    the cascade, ``asr_ms``, ``llm_first_clause_ms``, ``tts_first_chunk_ms``).
    ``tool_call``: ``tool`` is one call event of the reply (``{"event": "tool_call_started" |
    "tool_call_arguments_delta" | "tool_call_done" | "tool_call_failed", ...its fields}``,
    :mod:`omniduplex.pipeline.stages.tool_calls`); it comes before the message's ``text``.
    ``error``: ``error`` says what failed; the turn is over.
    """

    kind: EventKind
    request_id: str
    text: str = ""
    pcm: Any = None
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    words: list = field(default_factory=list)
    tool: dict = field(default_factory=dict)
