"""The tool prompt in the prefix cache, on the real SmolLM2-135M-Instruct weights: a second session with the
same system prompt and tools computes only its own words, and a prefill hint that carries the turn's tools
is a prefix the turn reuses whole (a hint without them would share almost nothing: tools are rendered into
the system part of the prompt)."""

from __future__ import annotations

import pytest
from tool_models import bench_tools, one_thread, smollm2_dir  # noqa: F401 (fixture)

from omniduplex.models.registry import load_model
from omniduplex.pipeline.messages import (
    PartialTranscript,
    Prefill,
    StageMessage,
    Transcript,
    TurnOptions,
    meta_from_wire,
    meta_to_wire,
)
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.llm import LLMWorker
from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")
SHORT = {"max_tokens": 4}


@pytest.fixture(scope="module")
def model():
    return load_model(smollm2_dir(), parts=("thinker",))


def _turn(rid: str, transcript: str, tools: list | None = None) -> StageMessage:
    opts = TurnOptions(
        system_prompt=SPOKEN_SYSTEM_PROMPT, tools=tools or bench_tools(), tool_choice="auto", sampling=SHORT
    )
    return StageMessage(rid, {}, Transcript(turn=opts, transcript=transcript))


def _reused(worker: LLMWorker, msg: StageMessage) -> int:
    """Prompt rows turn ``msg`` took from the prefix cache."""
    before = worker.engine.scheduler.num_reused_tokens
    worker.submit(msg)
    while worker.has_work():
        worker.step()
    return worker.engine.scheduler.num_reused_tokens - before


def test_a_second_session_reuses_the_system_prompt_and_tool_schemas(model):
    worker = LLMWorker(model, EngineSettings(num_blocks=256, max_num_seqs=4, max_num_batched_tokens=512))
    first, second = _turn("s1-t1", "Where is my order 4217?"), _turn("s2-t1", "Book a table for two at noon.")
    a, b = worker.chat.prepare(first).ids, worker.chat.prepare(second).ids
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert shared > 300  # the system prompt and six tool schemas
    assert _reused(worker, first) == 0
    reused = _reused(worker, second)  # another session: no history, the same system prompt and tools
    assert shared - 16 < reused <= shared  # every full block of the shared part (plus rows of the next)
    # the same tools in another order: another system part
    other = _turn("s3-t1", "Book a table for two at noon.", bench_tools()[::-1])
    c = worker.chat.prepare(other).ids
    common = next(i for i, (x, y) in enumerate(zip(a, c)) if x != y)
    assert common < shared - 100 and _reused(worker, other) <= common  # only what is really the same


def test_a_prefill_hint_with_the_turns_tools_is_reused_whole(model):
    context = Prefill(system_prompt=SPOKEN_SYSTEM_PROMPT, history=[], tools=bench_tools(), tool_choice="auto")
    partial = PartialTranscript(partial_transcript="What's the weather like in", prefill=context)
    assert meta_from_wire(meta_to_wire(partial)) == partial  # the edge carries the tools in a hint's context
    msg = StageMessage("t", {}, partial, last=False)
    warm = LLMWorker(model, EngineSettings(num_blocks=256, max_num_seqs=4, max_num_batched_tokens=512))
    warm.submit(msg)
    while warm.has_work():
        assert warm.step() == []  # a hint says nothing
    opts = TurnOptions(
        system_prompt=SPOKEN_SYSTEM_PROMPT, history=[], tools=bench_tools(), tool_choice="auto"
    )
    hinted = warm.chat.hint_ids("t", opts, "What's the weather like in")
    turn = _turn("t", "What's the weather like in Paris right now?")
    prompt = warm.chat.prepare(turn).ids
    assert len(hinted) > 300 and prompt[: len(hinted)] == hinted
    assert _reused(warm, turn) == len(hinted)  # every row of the hint, its partial block's too
