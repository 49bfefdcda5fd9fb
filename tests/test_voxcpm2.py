"""VoxCPM2 on our engine: batching changes nothing, the batched flow-matching tail equals the per-request one
(one solver call per step instead of one per request), voice prefixes come from the prefix cache, the
streamed AudioVAE decode equals the one-shot decode, and bad input fails clearly without disturbing others."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from typer.testing import CliRunner

from omniduplex.cli.main import cli
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.voxcpm2.model import load_voxcpm2
from omniduplex.models.voxcpm2.presets import write_voxcpm2_checkpoint
from omniduplex.models.voxcpm2.prompt import PromptError, TextTokenizer, VoiceBank, build_prompt
from omniduplex.models.voxcpm2.vae_stream import VAEStream, feed_together
from omniduplex.pipeline.speech.voxcpm2 import VoxCPM2Engine, synthesize
from omniduplex.pipeline.stages.engine_build import EngineSettings

LSB = 1 / 32768
TEXTS = ("Hello the world!", "a b c", "The quick brown fox", "你好世界 in the end", "x")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = write_voxcpm2_checkpoint(
        tmp_path_factory.mktemp("vox") / "tiny", "tiny", seed=3
    )  # its stop head fires
    model = load_voxcpm2(path)
    tok = TextTokenizer(Tokenizer.from_file(str(path / "tokenizer.json")))
    bank = VoiceBank(model.lm, model.vae)
    t = np.arange(48000) / 16000  # 3 s: 19 patches, the prefix fills a KV block
    bank.register("tone", reference=(0.3 * np.sin(2 * np.pi * 220 * t).astype(np.float32), 16000))
    return path, model, tok, bank


def _sampling(i: int) -> dict:
    # the stop head of this checkpoint fires once allowed (after min_len + 1 patches) or the budget ends first
    return {"seed": 100 + i, "min_len": 2 + i, "max_len": (8, 3, 9, 4, 12)[i % 5]}


def _run(engine: VoxCPM2Engine, add: dict[int, list]) -> dict[str, tuple[torch.Tensor, str]]:
    """Step ``engine`` until idle, calling ``add[step]`` (``(id, prompt, sampling)`` items) at that step."""
    latents: dict[str, list] = {}
    reasons: dict[str, str] = {}
    step = 0
    while add or engine.has_unfinished():
        for rid, prompt, sp in add.pop(step, []):
            engine.add(rid, prompt, sp)
        for ev in engine.step():
            latents.setdefault(ev.request_id, []).append(ev.latents)
            if ev.finished:
                reasons[ev.request_id] = ev.finish_reason
        step += 1
    return {k: (torch.stack(v), reasons[k]) for k, v in latents.items()}


def _prompts(model, tok, bank):
    voices = [None, "tone", None, "tone", None]
    return [build_prompt(model.lm, tok, t, bank.get(v), model.config.context) for t, v in zip(TEXTS, voices)]


def test_batched_equals_alone_and_lever_on_equals_off(setup):
    """Five requests of different lengths joining at steps 0, 0, 2, 3, 5 (prefill chunks of 24 rows mixed with
    decodes, two sharing a voice prefix) give each request the patches it gets alone, with the solver tail
    batched or not; batched, a step makes all its patches in one solver call."""
    _, model, tok, bank = setup
    prompts = _prompts(model, tok, bank)
    alone = {}
    one = EngineSettings(num_blocks=64, max_num_seqs=1)
    for i, p in enumerate(prompts):
        alone.update(_run(VoxCPM2Engine(model, one), {0: [(f"r{i}", p, _sampling(i))]}))
    sizes = EngineSettings(num_blocks=96, max_num_seqs=8, max_num_batched_tokens=24)
    for lever in (True, False):
        engine = VoxCPM2Engine(model, sizes, batch_solver=lever)
        joins = {0: [0, 1], 2: [2], 3: [3], 5: [4]}
        got = _run(
            engine, {s: [(f"r{i}", prompts[i], _sampling(i)) for i in ids] for s, ids in joins.items()}
        )
        for rid, (want, reason) in alone.items():
            assert got[rid][1] == reason, rid
            torch.testing.assert_close(got[rid][0], want, rtol=0, atol=1e-5)
        patches = sum(v[0].shape[0] for v in got.values())
        if lever:
            assert engine.solver_calls == engine.decode_steps < patches
        else:
            assert engine.solver_calls == patches
    assert {r for _, r in alone.values()} == {"stop", "length"}


def test_preempted_request_resumes_where_it_was(setup):
    """Two requests that cannot both grow in 4 KV blocks: the younger is preempted, recomputed from its
    prompt and patch rows (both LMs), and still makes the patches it makes alone (its noise goes on)."""
    _, model, tok, _ = setup
    p = build_prompt(model.lm, tok, "Hello the world!", None, model.config.context)
    sp = {"ignore_stop": True, "max_len": 64 - len(p.ids)}  # 4 blocks of rows: the cache holds one at a time
    solo = VoxCPM2Engine(model, EngineSettings(num_blocks=8, max_num_seqs=1))
    want = _run(solo, {0: [("b", p, {**sp, "seed": 2})]})
    engine = VoxCPM2Engine(model, EngineSettings(num_blocks=4, max_num_seqs=2))
    got = _run(engine, {0: [("a", p, {**sp, "seed": 1}), ("b", p, {**sp, "seed": 2})]})
    assert engine.engine.scheduler.num_preemptions > 0
    torch.testing.assert_close(got["b"][0], want["b"][0], rtol=0, atol=1e-5)


def test_solver_calls_per_step_at_16_concurrent(setup):
    _, model, tok, _ = setup
    prompts = [build_prompt(model.lm, tok, TEXTS[i % 5], None, model.config.context) for i in range(16)]
    calls = {}
    for lever in (True, False):
        engine = VoxCPM2Engine(model, EngineSettings(num_blocks=256, max_num_seqs=16), batch_solver=lever)
        sp = {"ignore_stop": True, "max_len": 4}
        _run(engine, {0: [(f"u{i}", p, {**sp, "seed": i}) for i, p in enumerate(prompts)]})
        calls[lever] = engine.solver_calls / engine.decode_steps
    assert calls[True] == 1.0 and calls[False] == 16.0


def test_voice_prefix_is_shared_through_the_prefix_cache(setup):
    _, model, tok, bank = setup
    voice = bank.get("tone")
    a, b = (build_prompt(model.lm, tok, t, voice, model.config.context) for t in ("a b c", "x y"))
    engine = VoxCPM2Engine(model, EngineSettings(num_blocks=64, max_num_seqs=2))
    first = _run(engine, {0: [("a", a, {"seed": 1, "max_len": 3})]})
    before = engine.engine.num_cached_tokens
    second = _run(engine, {0: [("b", b, {"seed": 2, "max_len": 3})]})
    assert engine.engine.num_cached_tokens - before >= 16  # the clip prefix: at least one full block
    cold = VoxCPM2Engine(model, EngineSettings(num_blocks=64, max_num_seqs=2, enable_prefix_caching=False))
    torch.testing.assert_close(_run(cold, {0: [("b", b, {"seed": 2, "max_len": 3})]})["b"][0], second["b"][0])
    assert first["a"][0].shape[0] == 3


def test_streamed_decode_equals_one_shot(setup):
    _, model, _, _ = setup
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 4, model.config.feat_dim, generator=g)  # six patches
    with torch.no_grad():
        want = model.vae.decode(z.reshape(-1, z.shape[-1]).T[None]).reshape(-1)
    stream = VAEStream(model.vae)
    pieces = [stream.feed(z[a:b]) for a, b in ((0, 1), (1, 1), (1, 4), (4, 6))] + [stream.flush()]
    assert pieces[0].shape[0] == 4 * model.config.vae.decode_hop  # the first patch alone: 160 ms
    assert (torch.cat(pieces) - want).abs().max() <= LSB
    with pytest.raises(ValueError, match="after flush"):
        stream.feed(z[:1])
    # several streams in one call: each row as its stream fed alone, states carried on
    streams = [VAEStream(model.vae) for _ in range(3)]
    together = [feed_together(streams, z[None, k : k + 1].expand(3, 1, 4, -1).contiguous()) for k in range(6)]
    for row in torch.cat(together, dim=1):
        assert (row - want).abs().max() <= LSB
    # continuation: the context patches are decoded ahead and dropped
    ctx = VAEStream(model.vae, context=z[:2])
    assert (ctx.feed(z[2:]) - want[2 * 4 * model.config.vae.decode_hop :]).abs().max() <= LSB


def test_synthesize_speaks_at_48k(setup):
    _, model, tok, bank = setup
    pcm, rate = synthesize(
        model, tok, "a b c", bank.get("tone"), {"seed": 3, "max_len": 4, "ignore_stop": True}
    )
    assert rate == 48000 and pcm.shape == (4 * 4 * 1920,) and pcm.dtype == torch.float32
    assert 0 < pcm.abs().max() < 1


def test_bad_input_fails_clearly_while_another_request_finishes(setup):
    _, model, tok, bank = setup
    good = build_prompt(model.lm, tok, "a b c", None, model.config.context)
    solo = VoxCPM2Engine(model, EngineSettings(num_blocks=64, max_num_seqs=2))
    want = _run(solo, {0: [("ok", good, _sampling(1))]})
    engine = VoxCPM2Engine(model, EngineSettings(num_blocks=64, max_num_seqs=4))
    engine.add("ok", good, _sampling(1))
    seen = [ev.latents for ev in engine.step()]
    tone = (np.zeros(16000, dtype=np.float32), 16000)
    with pytest.raises(PromptError, match="unknown voice 'nobody'"):
        bank.get("nobody")
    with pytest.raises(PromptError, match="16000 Hz"):
        bank.register("bad", reference=(tone[0], 24000))
    with pytest.raises(PromptError, match="at least 0.5 s"):
        bank.register("short", reference=(tone[0][:4000], 16000))
    with pytest.raises(PromptError, match="go together"):
        bank.register("half", prompt=tone)
    with pytest.raises(PromptError, match="past the context"):
        build_prompt(model.lm, tok, "word " * 200, None, model.config.context)
    with pytest.raises(PromptError, match="empty"):
        build_prompt(model.lm, tok, "", None, model.config.context)
    with pytest.raises(ValueError, match="unknown VoxCPM2 sampling keys"):
        engine.add("bad", good, {"temperature": 0.7})
    with pytest.raises(ValueError, match="invalid"):
        engine.add("bad", good, {"inference_timesteps": 0})
    assert "bad" not in bank.names and "short" not in bank.names
    engine.add("gone", good, {"seed": 9})
    seen += [ev.latents for ev in engine.step() if ev.request_id == "ok"]
    assert engine.abort("gone")
    got = _run(engine, {})
    torch.testing.assert_close(torch.cat([torch.stack(seen), got["ok"][0]]), want["ok"][0], rtol=0, atol=1e-5)
    assert got["ok"][1] == want["ok"][1]
    assert engine.engine.scheduler.allocator.num_free == 64  # every block back (the aborted one's too)


def test_audiovae_pth_loads_as_published(setup, tmp_path):
    """The published repository ships the AudioVAE as ``audiovae.pth`` (a pickled state dict)."""
    path, model, _, _ = setup
    (tmp_path / "m").mkdir()
    for f in path.iterdir():
        if f.name != "audiovae.safetensors":
            (tmp_path / "m" / f.name).write_bytes(f.read_bytes())
    torch.save({"state_dict": load_file(path / "audiovae.safetensors")}, tmp_path / "m" / "audiovae.pth")
    vae = load_voxcpm2(tmp_path / "m", parts=("vae",)).vae
    for name, t in model.vae.state_dict().items():
        assert torch.equal(vae.state_dict()[name], t), name


def test_missing_tensor_is_named(setup, tmp_path):
    path, _, _, _ = setup
    for fname, victim in (
        ("model.safetensors", "residual_lm.layers.0.mlp.up_proj.weight"),
        ("audiovae.safetensors", "decoder.model.0.bias"),
    ):
        bad = tmp_path / fname.split(".")[0]
        bad.mkdir()
        for f in path.iterdir():
            (bad / f.name).write_bytes(f.read_bytes())
        tensors = load_file(bad / fname)
        del tensors[victim]
        save_file(tensors, str(bad / fname))
        with pytest.raises(CheckpointError, match=victim.replace(".", r"\.")):
            load_voxcpm2(bad)


def test_init_model_cli(tmp_path):
    res = CliRunner().invoke(cli, ["init-model", "--arch", "voxcpm2-tiny", "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["architecture"] == "voxcpm2"
    assert load_voxcpm2(tmp_path / "m").lm is not None
    res = CliRunner().invoke(cli, ["init-model", "--arch", "voxcpm2-huge", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "voxcpm2-huge" in res.output
