"""The cascade's LLM stage: the user's transcript → a chat prompt → streamed reply tokens and text deltas.

Input (from the ASR stage): no tensors; meta ``transcript`` (str), optional ``system_prompt`` (str),
``history`` (list of ``[role, text]``, role ``user``/``assistant``, and ``function_call`` /
``function_call_output`` items), ``tools`` and ``tool_choice`` (OpenAI function tools and the choice,
:mod:`omniduplex.models.cascade.tool_prompt`), ``spoken`` (default ``true``: the reply is for the ear,
:mod:`omniduplex.pipeline.text.spoken`; ``false`` passes the model's text as written), ``sampling`` (dict of
:class:`SamplingParams` fields) and any other keys (``voice``, ...), passed on untouched.

Output per sampled token: ``token`` int64 ``[1]``; meta ``text`` = the text this token adds to what is
said (incremental detokenization, then :class:`~.reply_stream.ReplyStream`: markdown stripped, text after
the first clause released clause by clause, call blocks left out; the stop token adds ``""``) and, when a
call block streams, its ``tool_call_*`` events (:mod:`.tool_calls`; a token whose text ends one call and
starts another gives two messages, the second with ``token`` int64 ``[0]``). The first message of a turn
also carries ``prompt_ids`` int64 ``[P]`` and the turn's input meta without ``sampling``/``tools``; the last
one (``last=True``) carries ``finish_reason`` (``stop``, ``length`` or ``tool_calls``: :mod:`.reply_stream`)
and, when the token budget cut a clause, ``unspoken`` (the text dropped). With tools, decoding is
grammar-constrained (:mod:`omniduplex.pipeline.engine.grammar`): every call's arguments parse and satisfy its
tool's schema. A transcript with no letters or digits does not reach the engine: one message ``token``
int64 ``[0]``, meta ``text=""``, ``skipped="empty transcript"`` + turn meta, ``last=True``.

Prefill while the user speaks: before a turn's message, the ASR stage may send ``last=False`` messages of the
turn still being spoken (meta ``partial_transcript`` and ``prefill`` = ``{system_prompt, history}``, with the
turn's ``tools`` / ``tool_choice`` when it has tools, see :mod:`.asr`). Each is a *prefill hint*: the chat of
the partial transcript, cut where a longer transcript could tokenize differently
(:meth:`ChatPrompter.hint_ids`), is prefilled as a one-token background request (planned after every turn of a
step, a chunk of at most :data:`~omniduplex.pipeline.engine.scheduler.BACKGROUND_TOKENS` rows a step: a turn
that ends never waits behind a long hint prefill) whose output is dropped; its full KV blocks stay in the
prefix cache, so at end of turn the turn's prompt finds the system prompt, history and the words already heard
computed and prefills only the rest (the idea of issue 24 item 3; prefix caching: vLLM's automatic prefix
caching, Kwon et al. 2023). A newer hint of a turn replaces one not yet run; the turn's own message drops a
hint still queued. Hints produce no output and fail silently.
"""

from __future__ import annotations

import contextlib
import queue
from dataclasses import replace
from typing import Any

import torch
from tokenizers import Tokenizer

from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.registry import LoadedModel
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.call_gate import DEFAULT_CALL_THRESHOLD
from omniduplex.pipeline.engine.grammar import TokenizerGrammars
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.speculative import SpeculativeConfig
from omniduplex.pipeline.messages import DecoderOutput, PartialTranscript, StageMessage, TurnOptions
from omniduplex.pipeline.stages.chat_prompt import (
    MAX_TOOL_CALLS,
    ChatPrompter,
    ChatTurn,
)
from omniduplex.pipeline.stages.contract import EngineGauges
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.llm_speculative import make_speculator
from omniduplex.pipeline.stages.tool_calls import EVENT_KEYS
from omniduplex.pipeline.text.detokenize import IncrementalDetokenizer
from omniduplex.pipeline.text.reply_text import ReplyStream

__all__ = ["ChatPrompter", "ChatTurn", "IncrementalDetokenizer", "LLMWorker", "TurnStream"]

HINT_SUFFIX = "#prefill"
"""Engine request id of a turn's prefill hint: the turn id + this suffix."""


class TurnStream:
    """The output side of one turn: messages per sampled id, as the module docstring describes (the first
    carries ``prompt_ids`` and the turn meta, each its text delta and call events, the last its finish
    reason). The text goes through the turn's :class:`~.reply_stream.ReplyStream` (calls, the ear, limits)."""

    def __init__(self, turn: ChatTurn, tokenizer: Tokenizer, stop_ids: tuple[int, ...]) -> None:
        self.prompt = torch.tensor(turn.ids, dtype=torch.int64)
        self.turn: TurnOptions | None = turn.turn  # None once the first message is out
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop_ids = stop_ids
        self.reply = ReplyStream(**turn.reply)

    def messages(self, rid: str, tok: int | None, finish_reason: str | None = None) -> list[StageMessage]:
        """The messages of sampled id ``tok`` (one, or more when its text holds events of two calls; ``None``:
        no new id, ``token`` int64 ``[0]``); ``finish_reason`` (``stop``/``length``) marks the last one. The
        reply may end here without it, when its :attr:`~.reply_stream.ReplyStream.stop` says so: the last
        message is then ``last`` too, and the caller ends the request in its engine."""
        new = tok is not None and tok not in self.stop_ids
        metas = self.reply.push(self.detok.push(tok) if new else "", tokens=int(tok is not None))
        if finish_reason is not None or self.reply.stop:
            metas += self.reply.push(self.detok.flush(), tokens=0)
            tail, finish_reason = self.reply.finish(finish_reason)
            metas += tail
        metas = compact_metas(metas)
        out = []
        for i, meta in enumerate(metas):
            tensors = {"token": torch.tensor([tok] if i == 0 and tok is not None else [], dtype=torch.int64)}
            turn, self.turn = self.turn, None  # the turn's options go with its first message
            if turn is not None:
                tensors["prompt_ids"] = self.prompt
            last = finish_reason is not None and i == len(metas) - 1
            if last:
                meta["finish_reason"] = finish_reason
                if self.reply.unspoken:
                    meta["unspoken"] = self.reply.unspoken
            out.append(StageMessage(rid, tensors, DecoderOutput(turn=turn, **meta), last=last))
        return out

    def message(self, rid: str, tok: int, finish_reason: str | None = None) -> StageMessage:
        """The one message of sampled id ``tok`` for a turn without tools (see :meth:`messages`)."""
        (msg,) = self.messages(rid, tok, finish_reason)
        return msg


def drain(out: queue.Queue, wait_s: float) -> list[Any]:
    """Every item in ``out`` now, oldest first, without blocking; when ``wait_s`` > 0 and ``out`` is empty,
    first wait up to ``wait_s`` seconds for one (how the API-backed LLM stages' ``step`` reads what their
    client thread streamed, without spinning a core while the server computes)."""
    items = []
    with contextlib.suppress(queue.Empty):
        items.append(out.get(timeout=wait_s) if wait_s else out.get_nowait())
        while True:
            items.append(out.get_nowait())
    return items


def compact_metas(metas: list[dict]) -> list[dict]:
    """Merge message metas (:class:`~.reply_stream.ReplyStream` output) where order allows (events of
    increasing rank, then text), dropping empty ones."""
    out = [metas[0]]
    for m in metas[1:]:
        prev = out[-1]
        events = [k for k in m if k in EVENT_KEYS]
        if not events:
            prev["text"] += m["text"]
            continue
        mine = [EVENT_KEYS.index(k) for k in prev if k in EVENT_KEYS]
        if not prev["text"] and all(r < min(EVENT_KEYS.index(k) for k in events) for r in mine):
            text = prev.pop("text")
            prev.update(m)
            prev["text"] = text + m["text"]
            continue
        out.append(m)
    return out


class LLMWorker(EngineGauges):
    """Continuous batching of a text LLM (Llama / Qwen3 checkpoints) over every turn in flight.

    Args:
        model: a loaded text LM (``load_model(dir, parts=("thinker",))``); its folder must hold
            ``tokenizer.json`` and may hold a chat template (else ChatML, see :mod:`.chat_template`).
        engine: the engine's settings (:class:`EngineSettings`); with ``enable_prefix_caching`` a session's
            next turn renders its history as the same tokens, so it computes only the new turn.
        max_tool_calls: most tool calls per user turn (the call loop is cut there).
        speculative, draft: speculative decoding (the manifest's ``llm_speculative``, parsed) and its draft
            model (``method: draft``), :mod:`.llm_speculative`; a step may then emit several ids of a turn.
        call_threshold: the calibrated call decision of a turn's first reply under ``tool_choice: auto``
            (:mod:`omniduplex.pipeline.engine.call_gate`): it calls when the model's probability of opening
            a call is at least this; ``None``: the first token's argmax decides (plain greedy).

    Raises:
        CheckpointError: no ``tokenizer.json``, no eos token, or a model without a text decoder.
    """

    def __init__(
        self,
        model: LoadedModel,
        engine: EngineSettings = EngineSettings(),
        max_tool_calls: int = MAX_TOOL_CALLS,
        speculative: SpeculativeConfig | None = None,
        draft: LoadedModel | None = None,
        call_threshold: float | None = DEFAULT_CALL_THRESHOLD,
    ) -> None:
        if call_threshold is not None and not 0.0 <= call_threshold <= 1.0:
            raise ValueError(f"call_threshold must be in [0, 1], got {call_threshold}")
        self.call_threshold = call_threshold
        if model.thinker is None or model.thinker.model is None:
            raise CheckpointError(f"{model.path}: not a text LM checkpoint (no decoder loaded)")
        self.chat = ChatPrompter(model.path, model.raw_config, max_tool_calls)
        self.tokenizer, self.template = self.chat.tokenizer, self.chat.template
        self.stop_ids = self.chat.stop_ids
        weight = model.thinker.lm_head.weight
        sizes = (engine.num_blocks, engine.max_num_seqs, engine.max_num_batched_tokens)
        vocab = model.thinker.cfg.vocab_size
        spec = make_speculator(speculative, draft, self.tokenizer, vocab, sizes, weight.dtype, weight.device)
        self.engine = engine.build(DecoderLMAdapter(model.thinker), weight, "llm", speculator=spec)
        self.turns: dict[str, TurnStream] = {}
        self._ready: list[StageMessage] = []  # skipped turns, emitted at the next step
        self.hinted_tokens = 0  # prompt tokens sent as prefill hints (a gauge for benchmarks)
        self._grammars: TokenizerGrammars | None = None  # built at the first turn with tools

    @property
    def grammars(self) -> TokenizerGrammars:
        """The tool grammars of this model's tokenizer (compiled once per tool set, cached)."""
        if self._grammars is None:
            self._grammars = TokenizerGrammars(self.tokenizer, self.engine.adapter.vocab_size, self.stop_ids)
        return self._grammars

    def messages(self, rid: str, opts: TurnOptions, transcript: str) -> list[dict]:
        """The chat of a turn (:meth:`ChatPrompter.messages`)."""
        return self.chat.messages(rid, opts, transcript)

    def submit(self, msg: StageMessage) -> None:
        """Queue a turn (see the module docstring for its fields).

        Raises:
            ValueError: a missing or non-string ``transcript``, malformed ``history``/``system_prompt``/
                ``sampling``, a bad tool or ``tool_choice`` (the message names the field), a template that
                rejects the chat, a duplicate id, or a prompt that cannot fit the KV cache (this turn only).
        """
        rid = msg.request_id
        if isinstance(msg.meta, PartialTranscript):
            self.prefill_hint(rid, msg.meta)
            return
        if rid in self.turns or any(m.request_id == rid for m in self._ready):
            raise ValueError(f"turn {rid}: already running")
        self.engine.abort(rid + HINT_SUFFIX)  # not run yet: the turn's own prefill covers it
        turn = self.chat.prepare(msg)
        if isinstance(turn, StageMessage):
            self._ready.append(turn)
            return
        if turn.tools.tools:  # every call's arguments parse and satisfy their schema; none when none allowed
            grammar = self.grammars.compile_tools(turn.tools)
            if turn.call_gate and self.call_threshold is not None:
                grammar = self.grammars.gated(grammar, self.call_threshold)
            turn.sampling = replace(turn.sampling, grammar=grammar)
        self.engine.add_request(Request(rid, turn.ids, turn.sampling))
        self.turns[rid] = TurnStream(turn, self.tokenizer, self.stop_ids)

    def prefill_hint(self, rid: str, partial: PartialTranscript) -> None:
        """Prefill the chat of turn ``rid``'s partial transcript (with its ``prefill``: system prompt and
        history) into the prefix cache, replacing a hint of that turn not yet run (see the module docstring).
        Does nothing for a turn already submitted, a transcript without words, or a hint that cannot be
        rendered or does not fit (a hint is only an optimisation)."""
        if rid in self.turns:
            return
        ctx = partial.prefill
        opts = (
            TurnOptions(
                system_prompt=ctx.system_prompt,
                history=ctx.history,
                tools=ctx.tools,
                tool_choice=ctx.tool_choice,
            )
            if ctx
            else TurnOptions()
        )
        try:
            ids = self.chat.hint_ids(rid, opts, partial.partial_transcript)
        except ValueError:
            return
        if not ids:
            return
        self.engine.abort(rid + HINT_SUFFIX)
        try:
            self.engine.add_request(
                Request(rid + HINT_SUFFIX, ids, SamplingParams(max_tokens=1), background=True)
            )
        except ValueError:
            return
        self.hinted_tokens += len(ids)

    def abort(self, request_id: str) -> None:
        """Drop a turn wherever it is; its KV blocks are free when this returns. No-op when unknown."""
        self.engine.abort(request_id + HINT_SUFFIX)
        self.engine.abort(request_id)
        self.turns.pop(request_id, None)
        self._ready = [m for m in self._ready if m.request_id != request_id]

    def has_work(self) -> bool:
        return bool(self._ready) or self.engine.has_unfinished()

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        """One engine step: a message per sampled token (plus any skipped turns' single message)."""
        outs, self._ready = self._ready, []
        for o in self.engine.step():
            stream = self.turns.get(o.request_id)
            if stream is None:
                continue
            for j, tok in enumerate(o.new_token_ids):  # several ids when drafts were kept
                ends = o.finished and j == len(o.new_token_ids) - 1
                msgs = stream.messages(o.request_id, tok, o.finish_reason if ends else None)
                outs += msgs
                if msgs[-1].last:
                    if not ends:  # the reply ended itself (text budget, call limit)
                        self.engine.abort(o.request_id)
                    self.turns.pop(o.request_id, None)
                    break
        return outs
