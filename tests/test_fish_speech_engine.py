"""Fish Speech S2 Pro on the engine: continuous batching equals running alone, the two levers (the slow AR's
q_len = 1 decode-attention fast path, the fast AR's buffers allocated once) change no code, voices and bad
requests fail clearly while other requests go on."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from omniduplex.kernels import attention, cpu_ops
from omniduplex.models.fish_speech.load import load_fish_speech
from omniduplex.models.fish_speech.presets import write_fish_checkpoint
from omniduplex.models.fish_speech.prompt import PromptError
from omniduplex.pipeline.speech.fish_speech import FishSpeechEngine, synthesize

TEXTS = ("Hello there!", "The weather tomorrow will be sunny and warm.", "Tea at eight?")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = write_fish_checkpoint(tmp_path_factory.mktemp("fish") / "tiny", "tiny")
    return load_fish_speech(d), Tokenizer.from_file(str(d / "tokenizer.json"))


def _run(engine: FishSpeechEngine, schedule: dict[int, list[tuple[str, object, int]]]) -> dict[str, list]:
    """Greedy frames per request; ``schedule[step]`` lists ``(id, prompt, max_tokens)`` added before that
    engine step."""
    frames: dict[str, list] = {}
    step = 0
    while step <= max(schedule) or engine.has_unfinished():
        for rid, prompt, n in schedule.get(step, []):
            engine.add(rid, prompt, {"temperature": 0, "max_tokens": n})
            frames[rid] = []
        for ev in engine.step():
            if ev.codes is not None:
                frames[ev.request_id].append(ev.codes.tolist())
        step += 1
    return frames


def test_batched_requests_equal_each_alone(tiny):
    model, tok = tiny
    engine = FishSpeechEngine(model, tok)
    prompts = [engine.prompt(t) for t in TEXTS]
    lengths = (12, 7, 10)
    alone = {
        f"r{i}": _run(engine, {0: [(f"r{i}", p, n)]})[f"r{i}"]
        for i, (p, n) in enumerate(zip(prompts, lengths))
    }
    together = _run(
        engine, {0: [("r0", prompts[0], 12)], 2: [("r1", prompts[1], 7)], 5: [("r2", prompts[2], 10)]}
    )
    assert together == alone
    assert engine.engine.num_cached_tokens > 0  # the second run of each prompt took its blocks from the cache
    assert all(len(f) >= 5 for f in alone.values())  # (r0 ends at <|im_end|> after 7 frames)


def test_levers_on_equal_off_and_the_fast_path_runs(tiny):
    model, tok = tiny
    engine = FishSpeechEngine(model, tok)
    prompts = [engine.prompt(t) for t in TEXTS]
    schedule = {0: [("a", prompts[0], 9), ("b", prompts[1], 9)], 3: [("c", prompts[2], 6)]}
    engine.set_levers(decode_fast_path=False, static_buffers=False)
    with attention.time_decode_attention() as off_timer:
        off = _run(engine, schedule)
    engine.set_levers(decode_fast_path=True, static_buffers=True)
    with attention.time_decode_attention() as on_timer:
        on = _run(engine, schedule)
    assert on == off
    assert on_timer.calls > 0 and off_timer.calls > 0  # decode-only steps' layers were timed, both ways
    if (
        cpu_ops.available()
    ):  # the fast path takes this model's shapes (head 16, GQA 2), else it would fall back
        slow = model.lm.cfg.slow
        q = torch.randn(3, slow.num_attention_heads, slow.head_dim)
        kv = torch.randn(4, 16, slow.num_key_value_heads, slow.head_dim)
        lens = torch.tensor([5, 16, 40], dtype=torch.int32)
        tables = torch.tensor([[0, 1, 2]] * 3, dtype=torch.int32)
        assert attention.gqa_decode(q, kv, kv, tables, lens, 0.25) is not None


def test_fast_ar_buffers_allocated_once_and_reused(tiny):
    model, tok = tiny
    engine = FishSpeechEngine(model, tok, static_buffers=True)
    predictor = model.lm.code_predictor
    predictor.workspace = None
    prompts = [engine.prompt(t) for t in TEXTS]
    engine.add("a", prompts[0], {"temperature": 0, "max_tokens": 10})
    engine.add("b", prompts[1], {"temperature": 0, "max_tokens": 10})
    engine.step()  # prefill + the first frames: the workspace is made for 2 frames
    ws = predictor.workspace
    ptrs = (ws.rows.data_ptr(), ws.k.data_ptr(), ws.v.data_ptr(), ws.cos.data_ptr(), ws.positions.data_ptr())
    engine.add("c", prompts[2], {"temperature": 0, "max_tokens": 10})  # 3 frames per step: grows once
    engine.step()
    grown = predictor.workspace
    assert grown.allocations == 2 and grown.capacity == 3
    ptrs = (grown.rows.data_ptr(), grown.k.data_ptr(), grown.v.data_ptr(), grown.cos.data_ptr())
    while engine.has_unfinished():
        engine.step()  # 3, then fewer frames a step: the same buffers every frame
        ws = predictor.workspace
        assert (
            ws is grown and (ws.rows.data_ptr(), ws.k.data_ptr(), ws.v.data_ptr(), ws.cos.data_ptr()) == ptrs
        )
    assert grown.allocations == 2
    # the reused buffers give the codes of freshly allocated ones
    hidden = torch.randn(3, model.lm.cfg.slow.hidden_size)
    code0 = torch.tensor([1, 5, 9])
    static = predictor.predict(hidden, code0, model.lm.code0_embedding(code0))
    predictor.static_buffers = False
    try:
        fresh = predictor.predict(hidden, code0, model.lm.code0_embedding(code0))
    finally:
        predictor.static_buffers = True
    assert torch.equal(static, fresh)


def test_bad_requests_fail_clearly_while_another_request_finishes(tiny):
    model, tok = tiny
    engine = FishSpeechEngine(model, tok)
    good = engine.prompt(TEXTS[1])
    alone = _run(engine, {0: [("good", good, 12)]})["good"]
    engine.add("good", good, {"temperature": 0, "max_tokens": 12})
    frames = [ev.codes.tolist() for ev in engine.step() if ev.codes is not None]
    one_second = torch.randn(44100) * 0.1
    bad = [
        (
            lambda: engine.prompt("Hi", voice="nobody"),
            "unknown voice 'nobody'; known voices: \\['default'\\]",
        ),
        (lambda: engine.register_voice("v", one_second, 24000, "Words."), "24000 Hz.*44100 Hz"),
        (lambda: engine.register_voice("v", one_second[:20000], 44100, "Words."), "0.45 s; at least 1.0 s"),
        (lambda: engine.register_voice("v", one_second, 44100, "  "), "ref_text"),
        (lambda: engine.prompt("   "), "text is empty"),
        (lambda: engine.prompt("Say <|im_end|> now"), "control token"),
        (lambda: engine.add("long", good, {"max_tokens": 4090}), "text past the context"),
    ]
    for call, message in bad:
        with pytest.raises(PromptError, match=message):
            call()
        frames += [ev.codes.tolist() for ev in engine.step() if ev.codes is not None]
    assert not engine.abort("never-added")
    while engine.has_unfinished():
        frames += [ev.codes.tolist() for ev in engine.step() if ev.codes is not None]
    assert frames == alone
    # a voice cloned from a valid clip is known by name afterwards and speaks
    engine.register_voice("narrator", one_second, 44100, "One second of reference.")
    assert engine.voice_names() == ["default", "narrator"]
    pcm, rate = synthesize(model, tok, "Hi.", "narrator", {"temperature": 0, "max_tokens": 4}, engine)
    assert rate == 44100 and pcm.shape == (3 * 2048,) and pcm.dtype.name == "float32"


def test_sampled_requests_are_reproducible_per_seed(tiny):
    model, tok = tiny
    engine = FishSpeechEngine(model, tok)
    p = engine.prompt(TEXTS[0])

    def run(seed: int) -> list:
        engine.add("s", p, {"seed": seed, "max_tokens": 8})
        out = []
        while engine.has_unfinished():
            out += [ev.codes.tolist() for ev in engine.step() if ev.codes is not None]
        return out

    assert run(1) == run(1) and run(1) != run(2)


@pytest.mark.parametrize(
    ("talker_hidden", "shared", "project_codes"),
    [(None, False, True), (48, False, True), (48, True, False)],
    ids=["qwen3-omni", "qwen3-tts-1.7b", "fish-narrow-fast-ar"],
)
def test_predictor_workspace_equals_fresh_buffers_for_every_family(talker_hidden, shared, project_codes):
    from omniduplex.models.config import DecoderConfig
    from omniduplex.models.qwen3_omni.code_predictor import CodePredictor

    cfg = DecoderConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64,
    )  # fmt: skip
    torch.manual_seed(0)
    p = CodePredictor(cfg, 6, talker_hidden, shared_tables=shared, project_codes=project_codes).eval()
    with torch.no_grad():
        for t in p.parameters():
            t.normal_(0, 0.3)
    width = talker_hidden if (talker_hidden and project_codes) else 32
    hidden = torch.randn(5, talker_hidden or 32)
    code0 = torch.tensor([0, 3, 7, 11, 39])
    embed = torch.randn(5, width)
    fresh = p.predict(hidden, code0, embed)
    p.static_buffers = True
    assert torch.equal(p.predict(hidden[:2], code0[:2], embed[:2]), fresh[:2])  # a workspace for 2 frames
    assert torch.equal(p.predict(hidden, code0, embed), fresh)  # grown once for 5
    assert p.workspace.allocations == 2 and p.workspace.capacity == 5
    assert len({tuple(r) for r in fresh.tolist()}) == 5  # the frames differ: the test can tell them apart
