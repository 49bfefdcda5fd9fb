"""Grammar-constrained decoding: a token mask per constrained request, applied in the engine's sampler.

A request whose :class:`~.request.SamplingParams` carries a ``grammar`` (a :class:`CompiledGrammar`) is
decoded so that its output is always a sentence of that grammar: before each sample, the ids the grammar
cannot take next are set to ``-inf`` in that request's logits row; after it, the grammar's matcher advances
by the sampled id. Rows of unconstrained requests in the same batch are not touched, so a request decodes
the same ids alone or batched with others (the sampler's noise is per request:
:mod:`.sampler`).

The library is **xgrammar** 0.2.x (Dong et al. 2024, "XGrammar: Flexible and Efficient Structured Generation
Engine for Large Language Models"; its structural tags express "free text, or a tagged block whose body
satisfies a JSON Schema"), chosen over **llguidance** by measurement on our tokenizers
(``omniduplex bench tools --libs``, :mod:`omniduplex.benchmarks.grammar_libs`; figures in ``MODELS.md``):
on the six tools of ``benchmarks/tools.yaml`` and the SmolLM2 / Qwen2.5 vocabularies it compiles a tool set
in 50-150 ms and fills a mask in ~1-2 us per token (p50), where llguidance takes ~10x longer per mask
(with ms-long outliers) and ~5-15x the memory. llguidance stays out of the runtime dependencies.

* :class:`TokenizerGrammars` — one per tokenizer: xgrammar's vocabulary view (built from the
  ``tokenizers`` JSON, the model's vocabulary size, the stop ids) and its compiler; :meth:`compile_tools`
  compiles the grammar of a :class:`~omniduplex.models.cascade.tool_prompt.ToolSet` once and keeps it in an
  LRU cache (``cache_size`` sets, keyed by the set's canonical JSON).
* :class:`CompiledGrammar` — what a request carries (opaque to the sampler).
* :class:`GrammarBank` — the engine's side: a matcher per constrained request in flight, made at its first
  sampled token and freed when it finishes or is aborted (:meth:`GrammarBank.release`), the step's bitmask
  (``[B, ceil(V / 32)]`` int32, bit ``j`` of row ``i`` = id ``j`` allowed) filled for constrained rows only
  and applied in place (xgrammar's CPU kernel, or its CUDA kernel on a GPU's logits).

The tool grammar (Hermes / Qwen2.5 call format, :mod:`omniduplex.models.cascade.tool_prompt`):

* ``auto`` — free text, in which the trigger ``<tool_call>`` may only start a call block
  ``<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>`` with NAME one of the tools and ARGS a
  JSON object that satisfies that tool's ``parameters`` schema; text and blocks may alternate; a stop id ends
  the output anywhere in the text, never inside a block;
* ``required`` — one or more blocks separated by a newline, nothing else; a named function — one block of
  that function;
* ``none`` — free text that never holds ``<tool_call>``, ``{"name"`` or a code fence (no call can start: a
  small model does write calls it was not offered); no tools at all — no grammar.

JSON inside a block takes at most one whitespace character between tokens (``", "`` and ``": "`` as the
chat templates write arguments), so a small model cannot pad a call with endless newlines.

Raises from compilation: :class:`GrammarError` (a ``ValueError``) naming the tool whose schema xgrammar
cannot compile.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import torch

from omniduplex.models.cascade.tool_prompt import (
    ARGUMENTS_PREFIX,
    BARE_PREFIX,
    CALL_OPEN,
    CALL_PREFIX,
    CALL_SUFFIX,
    FENCE,
    ToolSet,
)
from omniduplex.pipeline.engine.call_gate import CallGate, call_start_ids

JSON_MAX_WHITESPACE = 1
"""Most consecutive whitespace characters between JSON tokens inside a call block."""


NO_CALL = [CALL_OPEN, '{"name"', FENCE]
"""What text may not hold when no call is allowed (``tool_choice: none``, or the turn's calls spent)."""


class GrammarError(ValueError):
    """A grammar that cannot be compiled (the message names the tool)."""


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A grammar compiled against one tokenizer: ``compiled`` (xgrammar's ``CompiledGrammar``), the
    ``vocab_size`` of the logits it masks, a ``key`` naming it (for logs and tests), and the ``gate`` that
    decides at the first sampled token whether the reply calls (:mod:`.call_gate`; ``None``: the grammar
    alone, greedy or sampled, decides)."""

    compiled: Any
    vocab_size: int
    key: str
    gate: CallGate | None = None

    def matcher(self):
        """A fresh xgrammar ``GrammarMatcher`` at the start of the grammar."""
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.compiled)


def _vocab_type(tokenizer_json: dict):
    """xgrammar's vocabulary encoding of a ``tokenizers`` tokenizer, from its decoder: byte-level BPE (GPT-2,
    Qwen2, SmolLM2), byte fallback (SentencePiece-style Llama/Mistral), else raw strings."""
    import xgrammar as xgr

    def kinds(dec) -> list[str]:
        if not isinstance(dec, dict):
            return []
        return [dec.get("type", "")] + [k for d in dec.get("decoders", []) for k in kinds(d)]

    found = kinds(tokenizer_json.get("decoder"))
    if "ByteLevel" in found:
        return xgr.VocabType.BYTE_LEVEL
    if "ByteFallback" in found:
        return xgr.VocabType.BYTE_FALLBACK
    return xgr.VocabType.RAW


class TokenizerGrammars:
    """Grammars compiled against one tokenizer, cached.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        vocab_size: the model's vocabulary (the logits' width; may exceed the tokenizer's).
        stop_ids: the ids that end a request (a grammar accepts them where the output may end).
        cache_size: compiled tool sets kept (least recently used dropped first).
    """

    def __init__(self, tokenizer, vocab_size: int, stop_ids: tuple[int, ...], cache_size: int = 64) -> None:
        import xgrammar as xgr

        vocab = [""] * vocab_size
        for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
            if i < vocab_size:
                vocab[i] = token
        kind = _vocab_type(json.loads(tokenizer.to_str()))
        self.info = xgr.TokenizerInfo(vocab, kind, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.vocab_size, self.cache_size = vocab_size, cache_size
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self._start_ids: list[torch.Tensor] | None = None
        self.compilations = 0  # grammars compiled (cache misses), for tests and benchmarks

    def compile_tools(self, tools: ToolSet) -> CompiledGrammar | None:
        """The grammar of ``tools`` (see the module docstring), from the cache when compiled before;
        ``None`` without tools.

        Raises:
            GrammarError: a tool's ``parameters`` that xgrammar rejects (the message names the tool).
        """
        if not tools.tools:
            return None
        key = tools.key() if tools.active else "none"
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = CompiledGrammar(self._compile(tools), self.vocab_size, key)
        with self._lock:
            self.compilations += 1
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def gated(self, grammar: CompiledGrammar, threshold: float) -> CompiledGrammar:
        """``grammar`` (an ``auto`` tool grammar) with the calibrated call decision at ``threshold``
        (:class:`~.call_gate.CallGate`; the call-opening ids of this vocabulary found once).

        Raises:
            ValueError: a threshold outside [0, 1].
        """
        if self._start_ids is None:
            found = call_start_ids(self.info.decoded_vocab)
            self._start_ids = [torch.tensor(i, dtype=torch.int64) for i in found]
        start, whole, no_first = self._start_ids
        return replace(grammar, gate=CallGate(start, threshold, whole, no_first))

    def _compile(self, tools: ToolSet):
        from xgrammar.structural_tag import (
            AnyTextFormat,
            JSONSchemaFormat,
            StructuralTag,
            TagFormat,
            TagsWithSeparatorFormat,
            TriggeredTagsFormat,
        )

        def tag(t, prefix=CALL_PREFIX, suffix=CALL_SUFFIX):
            body = JSONSchemaFormat(json_schema=t.parameters, max_whitespace_cnt=JSON_MAX_WHITESPACE)
            return TagFormat(begin=f"{prefix}{t.name}{ARGUMENTS_PREFIX}", content=body, end=suffix)

        if not tools.active:  # no call can start
            return self.compiler.compile_structural_tag(StructuralTag(format=AnyTextFormat(excludes=NO_CALL)))
        tags = [tag(t) for t in tools.callable]
        if tools.choice == "auto":  # the tagged form, and the bare and fenced ones some models write
            bare = [tag(t, BARE_PREFIX, "}") for t in tools.callable]
            fenced = [tag(t, f"{FENCE}json\n{BARE_PREFIX}", f"}}\n{FENCE}") for t in tools.callable]
            fmt = TriggeredTagsFormat(triggers=[CALL_OPEN, BARE_PREFIX, FENCE], tags=tags + bare + fenced)
        else:  # required, or one named function: calls only
            fmt = TagsWithSeparatorFormat(
                tags=tags, separator="\n", at_least_one=True, stop_after_first=tools.choice != "required"
            )
        try:
            return self.compiler.compile_structural_tag(StructuralTag(format=fmt))
        except Exception as e:
            for t in tools.callable:  # name the tool that does not compile
                try:
                    self.compiler.compile_structural_tag(StructuralTag(format=tag(t)))
                except Exception as one:
                    i = tools.tools.index(t)
                    raise GrammarError(f"tools[{i}].parameters ({t.name}): {_reason(one)}") from None
            raise GrammarError(f"tools: the tool set does not compile ({_reason(e)})") from None


def _reason(e: Exception) -> str:
    """xgrammar's error message without its C++ log prefix (``[21:36:07] /project/cpp/x.cc:4950: ``)."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip())


class GrammarBank:
    """The engine's constrained decoding: a matcher per constrained request, masks for its logits rows.

    Args:
        vocab_size: the logits' width.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.width = (vocab_size + 31) // 32
        self._matchers: dict[str, Any] = {}
        self._bitmask = torch.zeros((0, self.width), dtype=torch.int32)

    def __len__(self) -> int:
        return len(self._matchers)

    def check(self, req) -> None:
        """Check a request's grammar before it is queued.

        Raises:
            GrammarError: not a :class:`CompiledGrammar`, or one compiled for another vocabulary size.
        """
        grammar = req.sampling.grammar
        if grammar is None:
            return
        if not isinstance(grammar, CompiledGrammar):
            raise GrammarError(f"request {req.request_id}: grammar must be a CompiledGrammar")
        if grammar.vocab_size != self.vocab_size:
            have = f"grammar for {grammar.vocab_size} ids, logits have {self.vocab_size}"
            raise GrammarError(f"request {req.request_id}: {have}")

    def _matcher(self, req):
        m = self._matchers.get(req.request_id)
        if m is None:
            m = self._matchers[req.request_id] = req.sampling.grammar.matcher()
            for tok in req.output_ids:  # resumes a request that already sampled (not in normal use)
                m.accept_token(tok)
        return m

    def mask_(self, reqs: list, logits: torch.Tensor) -> None:
        """Set, in place, the ids each constrained request's grammar forbids next to ``-inf`` in its row of
        ``logits`` (``[B, vocab_size]``, row ``i`` = ``reqs[i]``); other rows are left as they are."""
        rows = [i for i, r in enumerate(reqs) if r.sampling.grammar is not None]
        if not rows:
            return
        import xgrammar as xgr

        if self._bitmask.shape[0] < len(reqs):
            rows_needed = max(len(reqs), 2 * self._bitmask.shape[0])
            self._bitmask = torch.full((rows_needed, self.width), -1, dtype=torch.int32)
        bitmask = self._bitmask[: len(reqs)]
        for i in rows:
            gate = reqs[i].sampling.grammar.gate
            if gate is not None and not reqs[i].output_ids:  # the reply's first token: call or words
                gate.decide_(logits[i])
            self._matcher(reqs[i]).fill_next_token_bitmask(bitmask, i)
        if logits.device.type != "cpu":
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=rows)

    def accept(self, reqs: list, tokens: list[int]) -> list[bool]:
        """Advance each constrained request's matcher by its sampled id; ``False`` where the grammar refused
        the id (only possible when every allowed id was also suppressed; the caller ends that request)."""
        ok = [True] * len(reqs)
        for i, (req, tok) in enumerate(zip(reqs, tokens)):
            if req.sampling.grammar is not None:
                ok[i] = bool(self._matcher(req).accept_token(tok))
        return ok

    def release(self, request_id: str) -> None:
        """Free the matcher of a finished or aborted request (no-op when it has none)."""
        self._matchers.pop(request_id, None)
