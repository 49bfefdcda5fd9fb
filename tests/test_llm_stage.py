"""The cascade LLM stage on the real SmolLM2-135M-Instruct weights: prompts, streamed text, skips, aborts."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from omniduplex.models.cascade.gguf_import import cached_import
from omniduplex.models.registry import load_model
from omniduplex.pipeline.messages import (
    PartialTranscript,
    Prefill,
    StageMessage,
    Transcript,
    TurnOptions,
    TurnRequest,
)
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.llm import IncrementalDetokenizer, LLMWorker


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from omniduplex.models.weights import SMOLLM2_135M, WeightsError, locate

    try:
        src = locate(SMOLLM2_135M)
    except WeightsError as e:
        pytest.skip(str(e))
    return load_model(cached_import(src, tmp_path_factory.mktemp("gguf-cache")), parts=("thinker",))


@pytest.fixture()
def worker(model):
    return LLMWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256))


def turn(rid: str, transcript, asr_ms: float | None = None, **options) -> StageMessage:
    """The ASR stage's transcript of turn ``rid`` with the turn's ``options``."""
    meta = Transcript(transcript=transcript, asr_ms=asr_ms, turn=TurnOptions(**options))
    return StageMessage(rid, {}, meta, last=True)


def drain(worker: LLMWorker, max_steps: int = 500) -> list[StageMessage]:
    outs: list[StageMessage] = []
    for _ in range(max_steps):
        if not worker.has_work():
            break
        outs += worker.step()
    assert not worker.has_work()
    return outs


def test_reply_streams_text_deltas(worker):
    worker.submit(
        turn("t1", "What is the capital of France?", voice="joe", sampling={"max_tokens": 40}, asr_ms=12.5)
    )
    outs = drain(worker)
    assert all(o.request_id == "t1" for o in outs) and len(outs) > 3
    first, last = outs[0], outs[-1]
    # the turn's options go on with the first message, less the LLM's own (sampling)
    assert first.meta.turn.voice == "joe" and first.meta.turn.sampling is None
    assert first.tensors["prompt_ids"].dtype == torch.int64 and first.tensors["prompt_ids"].dim() == 1
    assert all("prompt_ids" not in o.tensors and o.meta.turn is None for o in outs[1:])
    assert [o.last for o in outs] == [False] * (len(outs) - 1) + [True]
    assert last.meta.finish_reason == "stop"
    ids = [int(o.tensors["token"].item()) for o in outs]
    assert all(o.tensors["token"].shape == (1,) and o.tensors["token"].dtype == torch.int64 for o in outs)
    assert ids[-1] in worker.stop_ids  # its message carries the word held back until the reply ended
    text = "".join(o.meta.text for o in outs)
    assert text == worker.tokenizer.decode(ids, skip_special_tokens=True)
    assert "Paris" in text and text.isascii()


def test_history_and_system_prompt_are_in_the_prompt(worker):
    history = [["user", "My name is Ada and I like sailing."], ["assistant", "Nice to meet you, Ada!"]]
    system = "You are a terse voice assistant."
    worker.submit(
        turn("t2", "What do I like?", history=history, system_prompt=system, sampling={"max_tokens": 8})
    )
    outs = drain(worker)
    prompt = outs[0].tensors["prompt_ids"].tolist()
    rendered = worker.tokenizer.decode(prompt, skip_special_tokens=False)
    assert rendered.startswith(f"<|im_start|>system\n{system}<|im_end|>")
    assert "named SmolLM" not in rendered  # our system prompt replaces the template's default
    for _, text in history:
        sub = worker.tokenizer.encode(text, add_special_tokens=False).ids
        assert any(prompt[i : i + len(sub)] == sub for i in range(len(prompt))), text
    assert rendered.endswith("<|im_start|>user\nWhat do I like?<|im_end|>\n<|im_start|>assistant\n")
    assert outs[-1].last and outs[-1].meta.finish_reason in ("stop", "length")


@pytest.mark.parametrize("transcript", ["", "   ", " ... ?! ", "\n\t-"])
def test_empty_transcript_is_skipped_without_the_engine(worker, transcript):
    worker.submit(turn("t3", transcript, voice="joe", sampling={"max_tokens": 8}))
    assert worker.has_work()
    (msg,) = drain(worker)
    assert msg.last and msg.request_id == "t3"
    assert msg.tensors["token"].dtype == torch.int64 and msg.tensors["token"].shape == (0,)
    assert msg.meta.text == "" and msg.meta.skipped == "empty transcript"
    assert msg.meta.turn.voice == "joe" and msg.meta.turn.sampling is None
    assert worker.engine.num_steps == 0


def test_abort_frees_the_kv_blocks(worker):
    alloc = worker.engine.scheduler.allocator
    total = alloc.num_free
    worker.submit(turn("a", "Tell me a long story about a dragon.", sampling={"max_tokens": 200}))
    worker.submit(turn("b", "Count from one to fifty.", sampling={"max_tokens": 200}))
    worker.submit(turn("c", "..."))
    for _ in range(4):
        worker.step()
    assert alloc.num_free < total
    worker.abort("a")
    worker.abort("b")
    worker.abort("c")
    worker.abort("never-submitted")
    assert alloc.num_free == total and not worker.has_work() and worker.step() == []


def test_bad_input_is_a_value_error_for_that_turn_only(worker):
    worker.submit(turn("ok", "Say hello.", sampling={"max_tokens": 4}))
    for fields in ({"transcript": None}, {"history": "not a list"}, {"system_prompt": 3}):
        with pytest.raises(ValidationError, match=next(iter(fields))):  # a field of the wrong type: no turn
            turn("b1", **{"transcript": "hi", **fields})
    bad = [
        StageMessage("b2", {}, TurnRequest()),  # not a transcript
        turn("b3", "hi", history=[["robot", "beep"]]),
        turn("b6", "hi", sampling={"temprature": 0.5}),
        turn("b7", "hi", sampling={"top_p": 0.0}),
        turn("ok", "Duplicate id."),
    ]
    for msg in bad:
        with pytest.raises(ValueError):
            worker.submit(msg)
    outs = drain(worker)
    assert {o.request_id for o in outs} == {"ok"} and outs[-1].last


def test_incremental_detokenizer_holds_back_split_characters(worker):
    tok = worker.tokenizer
    text = "Grüße aus 東京 😀🎉 — naïve café! " * 3
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(tok)
    deltas, windows = [], []
    for i in ids:
        deltas.append(detok.push(i))
        windows.append(len(detok.ids) - detok.prefix)
    deltas.append(detok.flush())
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas  # some token completed no character
    assert max(windows) <= 8  # the decoded window stays short: linear in the reply length


SYSTEM = "You are a friendly voice assistant. Always answer in English, in one or two short sentences."
HISTORY = [["user", "Hello, who are you?"], ["assistant", "I am your voice assistant. How can I help?"]]


def hint(rid: str, partial: str, history=HISTORY) -> StageMessage:
    """The ASR stage's partial transcript of turn ``rid`` with the conversation to prefill."""
    context = Prefill(system_prompt=SYSTEM, history=history)
    meta = PartialTranscript(partial_transcript=partial, stable_transcript="", prefill=context)
    return StageMessage(rid, {}, meta, last=False)


def reused_by(worker: LLMWorker, msg: StageMessage) -> tuple[int, str]:
    """Prompt tokens the turn ``msg`` took from the prefix cache, and its greedy reply."""
    before = worker.engine.scheduler.num_reused_tokens
    worker.submit(msg)
    outs = drain(worker)
    return worker.engine.scheduler.num_reused_tokens - before, "".join(o.meta.text for o in outs)


def test_prefill_hints_put_the_words_heard_so_far_in_the_prefix_cache(model):
    question = "What is the capital city of France, and what is it famous for?"
    final = turn("t", question, history=HISTORY, system_prompt=SYSTEM, sampling={"max_tokens": 12})
    cold = LLMWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256))
    cold_reused, cold_text = reused_by(cold, final)

    warm = LLMWorker(model, EngineSettings(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256))
    warm.submit(hint("t", "What is the capital"))
    warm.submit(hint("t", "What is the capital city of France, and what"))  # replaces the first, not run yet
    assert warm.has_work()
    assert drain(warm) == []  # a hint says nothing
    alloc = warm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_blocks  # its blocks are released (cached, findable)
    hinted = warm.chat.hint_ids(
        "t",
        TurnOptions(system_prompt=SYSTEM, history=HISTORY),
        "What is the capital city of France, and what",
    )
    prompt = warm.chat.prepare(final).ids
    assert prompt[: len(hinted)] == hinted and len(hinted) < len(prompt)
    warm_reused, warm_text = reused_by(warm, final)
    assert warm_text == cold_text  # the same greedy reply
    assert cold_reused == 0 and warm_reused == len(hinted)  # every row of the hint, its partial block's too


def test_a_hint_of_a_turn_aborted_or_already_running_costs_nothing(worker):
    alloc = worker.engine.scheduler.allocator
    worker.submit(hint("x", "Tell me about"))
    worker.abort("x")  # the segment was not a turn: its hint goes with it
    assert not worker.has_work() and alloc.num_free == alloc.num_blocks
    worker.submit(hint("y", "   "))  # no words: nothing to prefill
    assert not worker.has_work()
    worker.submit(turn("z", "Say hi.", sampling={"max_tokens": 4}))
    worker.submit(hint("z", "Say hi"))  # late: the turn is running already
    outs = drain(worker)
    assert {o.request_id for o in outs} == {"z"} and outs[-1].last
    worker.submit(hint("w", "Hello", history=[["robot", "beep"]]))  # a hint that cannot render is dropped
    assert not worker.has_work()
