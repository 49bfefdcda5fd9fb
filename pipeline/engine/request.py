"""Requests as the engine sees them: inputs, sampling parameters, KV blocks, progress and outputs."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

_arrival = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH, Status.FINISHED_ABORTED)


@dataclass
class SamplingParams:
    """Per-request decoding controls (vLLM / ``transformers`` semantics).

    ``temperature == 0`` is greedy. ``top_k == 0`` and ``top_p == 1`` disable those filters.
    ``repetition_penalty`` (CTRL, Keskar et al. 2019) applies to the ids this request generated.
    ``seed`` makes sampling reproducible and independent of batch-mates; ``None`` draws one.
    ``suppress_token_ids`` are never sampled; ``stop_token_ids`` end the request (the id is kept).
    ``ignore_eos`` runs the request to ``max_tokens`` (fixed-length outputs for benchmarks and tests, as
    vLLM's knob of that name), but unlike vLLM it suppresses the stop ids: a codec EOS mid-stream would
    not decode.
    ``grammar`` (a :class:`.grammar.CompiledGrammar`, set by the stage, never from a client's meta) constrains
    every sampled id to the grammar (:mod:`.grammar`); a request whose grammar refuses its id ends there.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    suppress_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    grammar: Any = None

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_tokens < 1:
            raise ValueError(f"invalid sampling parameters: {self}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def never_sampled(self) -> tuple[int, ...]:
        """The ids masked out of sampling: ``suppress_token_ids``, plus the stop ids under ``ignore_eos``."""
        return self.suppress_token_ids + self.stop_token_ids if self.ignore_eos else self.suppress_token_ids


@dataclass(eq=False)
class Request:
    """One generation request.

    A request with a ``companion`` (the null-prompt twin of classifier-free guidance) is scheduled
    with it as one unit: admitted, preempted, aborted and batched together. While ``companion_live`` is
    False the companion is not run: it only receives the request's sampled ids, and catches up on them in
    one prefill chunk in the first step after the adapter sets ``companion_live`` (guidance is needed
    from then on).

    Inputs are ``prompt_ids`` (and, when given, ``prompt_embeds`` ``[P, hidden]`` which replace their
    embeddings, e.g. with audio rows merged in) followed by the request's own sampled ids; models that
    feed embeddings rather than ids append one row per decode step to ``decode_embeds``.

    KV state: ``blocks`` (the block table), ``num_computed`` (input rows whose KV is in those blocks),
    ``block_hashes`` (chain hashes of the full blocks of its inputs, filled lazily by the prefix cache),
    ``num_registered`` (leading blocks of ``blocks`` already offered to the prefix cache).
    Speculative decoding (:mod:`.speculative`): ``speculate`` (False: never given drafts), ``draft_ids`` (this
    step's draft ids, input rows after the pending one), ``draft_probs`` (float64 ``[k, V]``, the draft
    distributions of sampled drafts; ``None`` for deterministic ones), ``num_draft_tokens`` /
    ``num_accepted_tokens`` (drafts verified / kept, summed over the request's steps).
    ``background``: work that may wait (a prefill hint): planned after the other requests of a step, a
    chunk of at most :data:`.scheduler.BACKGROUND_TOKENS` rows a step.
    Accounting: ``num_cached_tokens`` (prompt rows taken from the prefix cache at first admission; ``-1``
    before it), ``num_prefill_computed`` (prompt rows run through the model, recomputations included).
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_embeds: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    arrival: int = field(default_factory=lambda: next(_arrival))
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    decode_embeds: list[torch.Tensor] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered: int = 0
    num_cached_tokens: int = -1
    num_prefill_computed: int = 0
    num_preemptions: int = 0
    slot: int = -1
    embed_inputs: bool = False
    companion: Request | None = None
    is_companion: bool = False
    companion_live: bool = True
    speculate: bool = True
    draft_ids: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    background: bool = False

    def __post_init__(self) -> None:
        if self.companion is not None:
            self.companion.is_companion = True
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        if self.prompt_embeds is not None and self.prompt_embeds.shape[0] != len(self.prompt_ids):
            raise ValueError(
                f"request {self.request_id}: {self.prompt_embeds.shape[0]} prompt embeddings for "
                f"{len(self.prompt_ids)} prompt ids"
            )

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_inputs(self) -> int:
        """Input rows known so far: the prompt, then every sampled id fed back (or, with ``embed_inputs``,
        every decode embedding built so far)."""
        return self.num_prompt + (len(self.decode_embeds) if self.embed_inputs else len(self.output_ids))

    @property
    def num_pending(self) -> int:
        return self.num_inputs - self.num_computed

    @property
    def group(self) -> list[Request]:
        """The scheduling unit: the request and its hidden CFG companion, if any."""
        return [self] if self.companion is None else [self, self.companion]


@dataclass
class RequestOutput:
    """What one engine step produced for one request.

    ``new_token_ids``: ids sampled this step (0 or 1; up to ``k + 1`` for a speculating request).
    ``extras``: model-specific streams, e.g. the
    Talker's full codec frame or Thinker hidden states. ``finished``/``finish_reason`` when done.
    ``num_cached_tokens``: on a request's first output, the prompt tokens its prefill took from the prefix
    cache (as OpenAI's ``usage.prompt_tokens_details.cached_tokens``); ``None`` on later outputs.
    ``num_draft_tokens`` / ``num_accepted_tokens``: the request's speculative counters so far
    (:mod:`.speculative`).
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    num_cached_tokens: int | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
