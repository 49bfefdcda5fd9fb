"""The calibrated call decision (pipeline/engine/call_gate.py): the rule on logits, the call-opening ids of a
real vocabulary, and the gate inside the engine (a tiny random Qwen3 text model: at threshold 0 every reply
opens a call and the grammar completes it, at threshold 1 none does)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_engine import run
from tokenizers import Tokenizer
from tool_models import bench_tools, one_thread, qwen05_dir  # noqa: F401 (fixture)

from omniduplex.models.cascade.tool_prompt import tool_set
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.call_gate import CallGate, call_start_ids
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.grammar import TokenizerGrammars
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.stages.tool_calls import DONE, ToolCallParser

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_decision_is_on_the_call_mass_not_the_argmax():
    # ids 1, 2 open a call (2 a whole opener, 1 a partial one), 4 is blank
    starts, whole, blank = (torch.tensor(i, dtype=torch.int64) for i in ([1, 2], [2], [4]))
    gate = CallGate(starts, 0.3, whole, blank)
    # the argmax is a word (id 0: 0.4), but the two call-opening ids hold 0.25 + 0.15 = 0.4 >= 0.3: a call,
    # opened by the whole opener (id 2), though the partial one (id 1) is likelier
    row = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.1]).log()
    assert math.isclose(gate.p_call(row), 0.4, rel_tol=1e-5)
    assert gate.decide_(row)
    assert torch.isinf(row[[0, 1, 3, 4]]).all() and int(row.argmax()) == 2
    # the argmax opens a call (id 1: 0.25) but the call mass is 0.25 < 0.3: words, not after a blank (id 4)
    row = torch.tensor([0.2, 0.25, 1e-9, 0.2, 0.35]).log()
    assert not gate.decide_(row)
    assert torch.isinf(row[[1, 2, 4]]).all() and int(row.argmax()) in (0, 3)


def test_a_bad_threshold_or_id_set_is_refused():
    with pytest.raises(ValueError, match="call_threshold"):
        CallGate(torch.tensor([1]), threshold=1.5)
    with pytest.raises(ValueError, match="start_ids"):
        CallGate(torch.tensor([], dtype=torch.int64), threshold=0.3)
    with pytest.raises(ValueError, match="whole_ids"):
        CallGate(torch.tensor([1]), 0.3, torch.tensor([1.0]))


def test_the_call_opening_ids_of_qwen25():
    tok = Tokenizer.from_file(str(qwen05_dir() / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    decoded = [b""] * (max(vocab.values()) + 1)
    for i in vocab.values():
        decoded[i] = tok.decode([i], skip_special_tokens=False).encode()
    start, whole, no_first = (set(ids) for ids in call_start_ids(decoded))
    for opener in ("<tool_call>", "```", '{"', "<"):
        assert tok.token_to_id(opener) in start, opener
    assert {tok.token_to_id("<tool_call>"), tok.token_to_id("```")} <= whole <= start
    assert tok.token_to_id("<") not in whole and tok.token_to_id('{"') not in whole  # partial openers
    for word in ("Hello", "The", " The", "Sure", "\n", "{}"):  # words, space and an empty object open no call
        i = tok.encode(word, add_special_tokens=False).ids
        assert len(i) == 1 and i[0] not in start, word
    (newline,) = tok.encode("\n", add_special_tokens=False).ids
    assert newline in no_first and tok.token_to_id("Hello") not in no_first
    for markup in ("{{", "{}", "[", " <", "`"):  # no spoken reply starts with markup (nor a call after it)
        i = tok.encode(markup, add_special_tokens=False).ids
        assert len(i) == 1 and i[0] in no_first, markup
    for word in ("Hello", " The", "I", '"', "1", "(", "."):
        i = tok.encode(word, add_special_tokens=False).ids
        assert len(i) == 1 and i[0] not in no_first, word


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("text"), "tiny", seed=5, text_only=True)
    thinker = load_model(d).thinker
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    stop = (tok.token_to_id("<|im_end|>"),)
    grammars = TokenizerGrammars(tok, thinker.cfg.vocab_size, stop)
    return thinker, tok, stop, grammars, grammars.compile_tools(tool_set(bench_tools(), "auto"))


def _replies(tiny, threshold: float | None, n: int = 6) -> list[str]:
    thinker, tok, stop, grammars, auto = tiny
    grammar = auto if threshold is None else grammars.gated(auto, threshold)
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_seqs=n, max_num_batched_tokens=256)
    reqs = [
        Request(f"r{i}", [(7 * i + k) % 200 + 3 for k in range(5 + i)], SamplingParams(
            max_tokens=80, temperature=0.8, seed=i, stop_token_ids=stop, grammar=grammar
        ))
        for i in range(n)
    ]
    out = run(engine, {0: reqs})
    assert len(engine.grammars) == 0
    return [tok.decode(out[f"r{i}"]) for i in range(n)]


def _calls(text: str) -> list:
    p = ToolCallParser()
    return [v for k, v in p.push(text) + p.finish() if k == DONE]


def test_in_the_engine_threshold_zero_always_calls_and_one_never(tiny):
    schemas = {t["name"]: t["parameters"] for t in bench_tools()}
    for text in _replies(tiny, 0.0):  # the first id opens a call; the grammar makes it a whole, valid one
        assert text.lstrip()[:1] in "<{`", text
        calls = _calls(text)
        if calls:  # random weights may run out of tokens inside the call's strings
            assert json.loads(calls[0].arguments) is not None and calls[0].name in schemas
    for text in _replies(tiny, 1.0):  # no call may open at the first id
        assert text[:1] not in "<{`", text


def test_only_a_turns_first_reply_under_auto_is_gated(tiny, tmp_path):
    from omniduplex.pipeline.config import StageConfig
    from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
    from omniduplex.pipeline.stages.chat_prompt import ChatPrompter

    d = write_checkpoint(tmp_path, "tiny", seed=5, text_only=True)
    chat = ChatPrompter(d, {})
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    result = {"type": "function_call_output", "call_id": "c1", "output": '{"conditions": "rain"}'}

    def gated(said: str = "Weather in Paris?", **update) -> bool:
        opts = TurnOptions(tools=bench_tools(), tool_choice="auto").model_copy(update=update)
        return chat.prepare(StageMessage("t", {}, Transcript(transcript=said, turn=opts))).call_gate

    assert gated()
    assert not gated(tool_choice="required") and not gated(tool_choice="none")
    # a continuation after the tool's result: the model's own choice (the gate never pushes a second call)
    assert not gated("", user_text="", history=[["user", "Weather in Paris?"], call, result])
    with pytest.raises(ValueError, match="call_threshold"):
        StageConfig(call_threshold=1.5)
    assert StageConfig(call_threshold=None).call_threshold is None
