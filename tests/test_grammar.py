"""Grammar-constrained decoding (xgrammar) on the real SmolLM2 and Qwen2.5 tokenizers: whatever the logits, a
call's arguments parse and satisfy the tool's schema; ``auto`` lets plain text through; the engine masks
only constrained rows, so a batch decodes as each request alone; matchers are freed; grammars are cached."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from tool_models import bench_tools, qwen05_dir, smollm2_dir

from omniduplex.models.cascade.tool_prompt import call_block, tool_set
from omniduplex.models.checkpoint import read_config
from omniduplex.pipeline.engine.grammar import GrammarBank, GrammarError, TokenizerGrammars
from omniduplex.pipeline.engine.request import SamplingParams
from omniduplex.pipeline.stages.tool_calls import DONE, FAILED, ToolCallParser

OPENED = "Sure, one moment.\n<tool_call>\n"
SCHEMAS = {t["name"]: t["parameters"] for t in bench_tools()}
CHOICES = ["auto", "required", *({"type": "function", "name": n} for n in SCHEMAS)]


class Vocab:
    """A model's tokenizer, its stop ids and tool grammars."""

    def __init__(self, folder) -> None:
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.size = read_config(folder)["vocab_size"]
        self.stop = tuple(
            i for i in (self.tok.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")) if i is not None
        )
        self.grammars = TokenizerGrammars(self.tok, self.size, self.stop)
        texts = [self.tok.id_to_token(i) or "" for i in range(self.size)]
        # ids that close or open structure: the adversary pushes these
        self.structural = torch.tensor(
            [i for i, t in enumerate(texts) if any(c in t for c in '"{}[],:<>/\n')]
        )


@pytest.fixture(scope="module", params=["smollm2", "qwen2.5-0.5b"])
def vocab(request) -> Vocab:
    return Vocab(smollm2_dir() if request.param == "smollm2" else qwen05_dir())


def decode(
    v: Vocab, grammar, seed: int, adversarial: bool, prefix: str = "", max_steps: int = 300
) -> tuple[list[int], bool]:
    """Ids picked as the argmax of random (and, if ``adversarial``, structure-boosted) logits under the
    grammar's mask, after the ids of ``prefix``; and whether a stop id ended them."""
    bank = GrammarBank(v.size)
    sampling = SamplingParams(grammar=grammar, stop_token_ids=v.stop)
    req = SimpleNamespace(request_id="r", sampling=sampling, output_ids=[])
    for tok in v.tok.encode(prefix, add_special_tokens=False).ids:
        assert bank.accept([req], [tok]) == [True]
        req.output_ids.append(tok)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(max_steps):
        logits = torch.randn(1, v.size, generator=gen) * 3
        if adversarial:
            pick = torch.rand(len(v.structural), generator=gen) < 0.3
            logits[0, v.structural[pick]] += 12.0
            logits[0, list(v.stop)] += 6.0
        bank.mask_([req], logits)
        tok = int(logits.argmax())
        assert bank.accept([req], [tok]) == [True], f"the grammar refused its own mask's id {tok}"
        if tok in v.stop:
            return req.output_ids, True
        req.output_ids.append(tok)
    return req.output_ids, False


def calls(v: Vocab, ids: list[int]) -> list[tuple[str, dict]]:
    parser = ToolCallParser()
    events = parser.push(v.tok.decode(ids, skip_special_tokens=True)) + parser.finish()
    return [(k, e) for k, e in events if k in (DONE, FAILED)]


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    choice=st.sampled_from(CHOICES),
    seed=st.integers(0, 2**31),
    adversarial=st.booleans(),
    opened=st.booleans(),
)
def test_any_logits_give_calls_that_parse_and_validate(vocab, choice, seed, adversarial, opened):
    """Random logits, or an adversary pushing quotes, braces, tags and stop ids: every call made parses and
    validates; a forced call is always made; ``auto`` text that opens a call (``opened``) must complete it."""
    grammar = vocab.grammars.compile_tools(tool_set(bench_tools(), choice))
    opened = opened and choice == "auto"
    ids, stopped = decode(vocab, grammar, seed, adversarial, prefix=OPENED if opened else "")
    found = calls(vocab, ids)
    for i, (kind, event) in enumerate(found):
        if kind == FAILED:  # only a call still being written when the step budget ran out
            assert not stopped and i == len(found) - 1 and "ended inside" in event.error, event
            continue
        jsonschema.validate(json.loads(event.arguments), SCHEMAS[event.name])
        if isinstance(choice, dict):
            assert event.name == choice["name"]
    if stopped and (choice != "auto" or opened):
        assert found and found[-1][0] == DONE  # a forced or opened call is always made


def _accepts(v: Vocab, grammar, text: str) -> bool:
    matcher = grammar.matcher()
    return all(
        matcher.accept_token(i) for i in [*v.tok.encode(text, add_special_tokens=False).ids, v.stop[0]]
    )


def test_auto_lets_plain_text_and_valid_calls_through(vocab):
    auto = vocab.grammars.compile_tools(tool_set(bench_tools(), "auto"))
    required = vocab.grammars.compile_tools(tool_set(bench_tools(), "required"))
    plain = "The weather in Paris is mild today, about 12 degrees.\n\nHave a nice day!"
    call = call_block("get_weather", {"city": "Paris", "unit": "celsius"})
    assert _accepts(vocab, auto, plain) and _accepts(vocab, auto, f"Let me check.\n{call}")
    assert _accepts(vocab, auto, f"{call}\n{call_block('get_time', {'timezone': 'Asia/Tokyo'})}")
    assert _accepts(vocab, required, call) and not _accepts(vocab, required, plain)
    bare = '{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}'
    fenced = f"```json\n{bare}\n```"
    none = vocab.grammars.compile_tools(tool_set(bench_tools(), "none"))
    assert _accepts(vocab, none, plain) and not _accepts(vocab, none, call)
    assert not _accepts(vocab, none, bare) and not _accepts(vocab, none, fenced)
    assert _accepts(vocab, auto, bare) and _accepts(vocab, auto, f"Sure. {bare} Done.")
    assert not _accepts(vocab, auto, '{"name": "get_time", "arguments": {"zone": 5}}')
    assert _accepts(vocab, auto, f"Sure.\n{fenced}") and not _accepts(vocab, auto, "```python\nprint(1)\n```")
    for bad in (
        call_block("get_weather", {"city": 5}),  # wrong type
        call_block("get_weather", {"unit": "celsius"}),  # required field missing
        call_block("get_order_status", {"order_id": "12a"}),  # pattern
        call_block("book_table", {"date": "2026-11-28", "time": "19:00", "party_size": 40}),  # maximum
        call_block("get_weather", {"city": "Paris", "wind": "yes"}),  # additionalProperties: false
        call_block("order_pizza", {"size": "large"}),  # no such tool
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',  # never closed
    ):
        assert not _accepts(vocab, auto, f"Sure.\n{bad}"), bad


def test_grammars_are_compiled_once_per_tool_set(vocab):
    g = TokenizerGrammars(vocab.tok, vocab.size, vocab.stop, cache_size=2)
    a = g.compile_tools(tool_set(bench_tools(), "auto"))
    assert g.compile_tools(tool_set(bench_tools(), "auto")) is a and g.compilations == 1
    g.compile_tools(tool_set(bench_tools(), "required"))
    g.compile_tools(tool_set(bench_tools()[:2], "auto"))  # the LRU drops "auto" over all six tools
    assert g.compilations == 3 and g.compile_tools(tool_set(bench_tools(), "auto")) is not a
    none = g.compile_tools(tool_set(bench_tools(), "none"))  # one grammar for every set under "none"
    assert g.compile_tools(tool_set(bench_tools()[:1], "none")) is none and g.compilations == 5
    assert g.compile_tools(tool_set([], "auto")) is None


def test_a_schema_the_compiler_rejects_names_the_tool(vocab):
    bad = {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}},
    }
    with pytest.raises(GrammarError, match=r"^tools\[6\]\.parameters \(lookup\): .*\$defs"):
        vocab.grammars.compile_tools(tool_set([*bench_tools(), bad], "auto"))


def test_mask_touches_only_constrained_rows(vocab):
    grammar = vocab.grammars.compile_tools(tool_set(bench_tools(), "required"))
    bank = GrammarBank(vocab.size)
    reqs = [
        SimpleNamespace(request_id=str(i), sampling=SamplingParams(grammar=g), output_ids=[])
        for i, g in enumerate([None, grammar, None, grammar])
    ]
    logits = torch.randn(4, vocab.size)
    masked = logits.clone()
    bank.mask_(reqs, masked)
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    for row in (1, 3):  # the first id of a forced call: the start of "<tool_call>" only
        allowed = torch.isfinite(masked[row]).nonzero().flatten().tolist()
        assert allowed and all(CALL_START.startswith(vocab.tok.decode([i])) for i in allowed), allowed
    assert len(bank) == 2
    bank.release("1")
    bank.release("3")
    bank.release("9")
    assert len(bank) == 0


CALL_START = "<tool_call>"
