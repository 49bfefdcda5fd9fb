"""Parity of our Moshi family (models/moshi/) with Kyutai's ``moshi`` 0.2.13 package, its torch modules driven
directly (the oracle; installed apart with ``--no-deps`` by scripts/install.sh test). Weights are one random
preset written under the published tensor names and loaded into both. In fp32, over 52 frames of a fixed
input: the same Mimi codes (one-shot and streamed one 80 ms frame at a time), the same waveform within 1 LSB
of 16-bit audio, and the same greedy text tokens and audio codes from the LM (including a ring-KV wrap on
``tiny``, whose context is 32 frames)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from omniduplex.models.moshi.checkpoint import load_moshi, published_state, write_moshi_checkpoint
from omniduplex.models.moshi.config import FRAME_SAMPLES, lm_config, mimi_config
from omniduplex.models.moshi.lm import Sampling
from omniduplex.models.moshi.streaming import start_streaming, stop_streaming
from omniduplex.models.weights import packages_dir

FRAMES = 52
LSB = 1 / 32768


@pytest.fixture(scope="module")
def ref():
    """``moshi.models.loaders`` and ``moshi.models.lm.LMGen`` (imported from site-packages or the apart
    folder)."""
    apart = importlib.util.find_spec("moshi") is None
    if apart:
        sys.path.insert(0, str(packages_dir()))
    try:
        from moshi.models import loaders
        from moshi.models.lm import LMGen
        from moshi.utils.compile import no_compile
    finally:
        if apart:
            sys.path.remove(str(packages_dir()))
    return loaders, LMGen, no_compile


def _pcm() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, 1, FRAMES * FRAME_SAMPLES, generator=g) * 0.3).clamp(-1, 1)


def _check(preset: str, ref, tmp_path) -> None:
    loaders, LMGen, no_compile = ref
    ours = load_moshi(write_moshi_checkpoint(tmp_path / preset, preset, seed=0))
    ref_mimi = loaders.get_mimi(None, mimi_config(preset), device="cpu", num_codebooks=8)
    ref_mimi.load_state_dict(published_state(ours.mimi))
    ref_lm = loaders.get_moshi_lm(None, lm_kwargs=lm_config(preset), device="cpu", dtype=torch.float32).eval()
    ref_lm.load_state_dict(published_state(ours.lm))
    pcm, mimi, lm = _pcm(), ours.mimi, ours.lm
    with torch.no_grad(), no_compile():
        codes = mimi.encode(pcm)
        assert codes.shape == (1, 8, FRAMES)
        assert torch.equal(codes, ref_mimi.encode(pcm))
        start_streaming(mimi, 1)
        streamed = torch.cat(
            [mimi.encode(pcm[..., i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]) for i in range(FRAMES)], -1
        )
        wave_streamed = torch.cat([mimi.decode(codes[..., i : i + 1]) for i in range(FRAMES)], -1)
        stop_streaming(mimi)
        assert torch.equal(streamed, codes)
        wave = mimi.decode(codes)
        assert wave.abs().max() > 100 * LSB  # not silence
        assert (wave - ref_mimi.decode(codes)).abs().max() <= LSB
        assert (wave_streamed - wave).abs().max() <= LSB
        with ref_mimi.streaming(1):
            ref_streamed = torch.cat([ref_mimi.decode(codes[..., i : i + 1]) for i in range(FRAMES)], -1)
        assert (wave_streamed - ref_streamed).abs().max() <= LSB

        gen = LMGen(ref_lm, use_sampling=False)
        start_streaming(lm, 1)
        got, want = [], []
        with gen.streaming(1):
            for i in range(FRAMES):
                r = gen.step(codes[:, :, i : i + 1])
                out, ready = lm.step(codes[:, :, i], Sampling.greedy(1))
                assert bool(ready[0]) == (r is not None)
                if r is not None:
                    want.append(r[:, :, 0])
                    got.append(out)
        got_t, want_t = torch.stack(got, -1), torch.stack(want, -1)
        assert got_t.shape == (1, 9, FRAMES - 1)
        assert len(set(got_t[0, 0].tolist())) > 1  # the text stream is not constant
        assert torch.equal(got_t, want_t)


def test_tiny_matches_moshi_package(ref, tmp_path):
    _check("tiny", ref, tmp_path)


@pytest.mark.slow
def test_small_matches_moshi_package(ref, tmp_path):
    _check("small", ref, tmp_path)


def test_streaming_mimi_rejects_partial_frames(tmp_path):
    ours = load_moshi(write_moshi_checkpoint(tmp_path / "t", "tiny", seed=0))
    start_streaming(ours.mimi, 1)
    with pytest.raises(ValueError, match="multiple of 1920"):
        ours.mimi.encode(torch.zeros(1, 1, 1000))


def test_loader_names_the_bad_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_moshi_checkpoint(tmp_path / "t", "tiny", seed=0)
    state = load_file(str(folder / "model.safetensors"))
    state["text_linear.weight"] = state["text_linear.weight"][:, :5].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="text_linear.weight"):
        load_moshi(folder)


def test_init_model_writes_a_loadable_moshi_folder(tmp_path):
    from typer.testing import CliRunner

    from omniduplex.cli.main import cli

    out = tmp_path / "m"
    res = CliRunner().invoke(cli, ["init-model", "--arch", "moshi-tiny", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert '"architecture": "moshi"' in res.output
    assert (out / "tokenizer-e351c8d8-checkpoint125.safetensors").is_file()
    bad = CliRunner().invoke(cli, ["init-model", "--arch", "moshi-huge", "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "moshi-huge" in bad.output
