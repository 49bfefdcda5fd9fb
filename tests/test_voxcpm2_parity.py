"""VoxCPM2 against the reference package (``voxcpm`` 2.0.3, installed with ``--no-deps``), run here in fp32.

The reference loads our preset checkpoints with its own loader (``VoxCPM2Model.from_local``: the published
layout, tokenizer included) and generates with its own code (``generate_with_prompt_cache``). Its flow noise
comes from the global RNG (one ``randn`` per patch); ours from a generator per request seeded the same way,
so both sides draw the same noise and the latents must agree to float rounding, with the same length (the
stop head's decisions). The waveform of our streamed decode must be within 1 LSB (int16) of the reference's
one-shot decode.

Stubs: the reference imports ``torchaudio`` and ``librosa`` at module level; neither is installed here and no
code path used below calls them (audio files are never read: clip latents come from the reference's own
``audio_vae.encode`` with ``_encode_wav``'s padding), so empty modules stand in for them during the import.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from omniduplex.models.voxcpm2.model import load_voxcpm2
from omniduplex.models.voxcpm2.presets import write_voxcpm2_checkpoint
from omniduplex.models.voxcpm2.prompt import TextTokenizer, build_prompt, make_voice
from omniduplex.models.voxcpm2.vae_stream import VAEStream
from omniduplex.models.weights import packages_dir
from omniduplex.pipeline.speech.voxcpm2 import VoxCPM2Engine, synthesize
from omniduplex.pipeline.stages.engine_build import EngineSettings

LSB = 1 / 32768
TEXTS = ("Hello the world!", "a b 你好世界 in the end")


@pytest.fixture(scope="module")
def reference_cls():
    """``voxcpm.model.voxcpm2.VoxCPM2Model``, imported with empty stand-ins for its unused audio imports."""
    import transformers  # noqa: F401  (its package-availability checks run before the stand-ins exist)
    from transformers import LlamaTokenizerFast  # noqa: F401

    stubs = [
        n for n in ("torchaudio", "librosa") if n not in sys.modules and importlib.util.find_spec(n) is None
    ]
    for name in stubs:
        sys.modules[name] = types.ModuleType(name)
    apart = importlib.util.find_spec("voxcpm") is None  # installed apart, off sys.path (scripts/install.sh)
    if apart:
        sys.path.insert(0, str(packages_dir()))
    try:
        from voxcpm.model.voxcpm2 import VoxCPM2Model
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
        if apart:
            sys.path.remove(str(packages_dir()))
    return VoxCPM2Model


@pytest.fixture(scope="module")
def pairs(reference_cls, tmp_path_factory):
    """``preset -> (name, path, reference model, our model, tokenizer)``, built on first use."""
    cache: dict[str, tuple] = {}

    def get(preset: str) -> tuple:
        if preset not in cache:
            path = write_voxcpm2_checkpoint(tmp_path_factory.mktemp(f"vox_{preset}"), preset, seed=3)
            ref = reference_cls.from_local(str(path), optimize=False, device="cpu")
            tok = TextTokenizer(Tokenizer.from_file(str(path / "tokenizer.json")))
            cache[preset] = (preset, path, ref, load_voxcpm2(path), tok)
        return cache[preset]

    return get


@pytest.fixture(params=["tiny", "deep"])
def pair(request, pairs):
    return pairs(request.param)


def test_reference_loads_every_tensor_of_our_checkpoint(pair):
    _, path, ref, _, _ = pair
    ours = set(load_file(path / "model.safetensors")) | {
        "audio_vae." + k for k in load_file(path / "audiovae.safetensors")
    }
    assert sorted(k for k in ref.state_dict() if k not in ours) == []  # from_local loads with strict=False


def test_tokenizer_matches_reference(pair):
    _, _, ref, _, tok = pair
    for text in (*TEXTS, "naïve café 😀", "世界你好", " spaced  out "):
        assert tok(text) == ref.text_tokenizer(text), text


def _ours(ours, tok, text, voice, sampling):
    engine = VoxCPM2Engine(ours, EngineSettings(num_blocks=64, max_num_seqs=2))
    engine.add("r", build_prompt(ours.lm, tok, text, voice, ours.config.context), sampling)
    latents, reason = [], None
    while engine.has_unfinished():
        for ev in engine.step():
            latents.append(ev.latents)
            reason = ev.finish_reason
    return torch.stack(latents), reason


@pytest.mark.parametrize("case", [(0, 11, 2, 40), (1, 5, 6, 40), (1, 9, 2, 3)])
def test_zero_shot_latents_match_reference(pair, case):
    """Seeded noise on both sides: the same patches (float rounding) and the same stop step; cases stop by
    the stop head (min_len 2 and 6) and by the length budget (max_len 3)."""
    text_i, seed, min_len, max_len = case
    _, _, ref, ours, tok = pair
    torch.manual_seed(seed)
    _, _, want = ref.generate_with_prompt_cache(
        target_text=TEXTS[text_i], prompt_cache=None, min_len=min_len, max_len=max_len
    )
    got, reason = _ours(
        ours, tok, TEXTS[text_i], None, {"seed": seed, "min_len": min_len, "max_len": max_len}
    )
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert reason == ("length" if max_len == 3 else "stop")


def _ref_clip_feats(ref, wav: np.ndarray, pad_left: bool) -> torch.Tensor:
    """``VoxCPM2Model._encode_wav`` after its file read: pad to whole patches, encode, cut into patches."""
    audio = torch.from_numpy(wav)[None]
    span = ref.patch_size * ref.chunk_size
    pad = -audio.shape[1] % span
    audio = torch.nn.functional.pad(audio, (pad, 0) if pad_left else (0, pad))
    feat = ref.audio_vae.encode(audio, 16000)
    return feat.view(ref.audio_vae.latent_dim, -1, ref.patch_size).permute(1, 2, 0)


@pytest.mark.parametrize(
    "preset,mode",
    [
        ("tiny", "reference"),
        ("tiny", "continuation"),
        ("tiny", "ref_continuation"),
        ("deep", "ref_continuation"),
    ],
)
def test_cloning_matches_reference_waveform_within_1_lsb(pairs, preset, mode):
    """Each voice layout (the deep config runs the combined one, which holds both clip paths)."""
    _, _, ref, ours, tok = pairs(preset)
    rng = np.random.default_rng(5)
    t = np.arange(14000) / 16000
    clip = (0.3 * np.sin(2 * np.pi * 200 * t) + 0.05 * rng.standard_normal(t.shape[0])).astype(np.float32)
    cache, kw = {"mode": mode}, {}
    if mode != "continuation":
        cache["ref_audio_feat"] = _ref_clip_feats(ref, clip, pad_left=False)
        kw["reference"] = (clip, 16000)
    if mode != "reference":
        cache.update(audio_feat=_ref_clip_feats(ref, clip[:9000], pad_left=True), prompt_text="a b")
        kw.update(prompt=(clip[:9000], 16000), prompt_text="a b")
    torch.manual_seed(21)
    want_wav, _, want = ref.generate_with_prompt_cache(target_text="the end", prompt_cache=cache, min_len=4)
    voice = make_voice(ours.lm, ours.vae, "v", **kw)
    got, _ = _ours(ours, tok, "the end", voice, {"seed": 21, "min_len": 4})
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    pcm, rate = synthesize(ours, tok, "the end", voice, {"seed": 21, "min_len": 4})
    assert rate == 48000 and pcm.shape == want_wav.reshape(-1).shape
    assert (pcm - want_wav.reshape(-1)).abs().max() <= LSB


def test_audio_vae_matches_reference(pair):
    _, _, ref, ours, _ = pair
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, ours.config.feat_dim, 24, generator=g)
    with torch.no_grad():
        want = ref.audio_vae.decode(z).reshape(-1)
        got = ours.vae.decode(z).reshape(-1)
        stream = VAEStream(ours.vae)
        pieces = [stream.feed(z[0, :, a:b].T) for a, b in ((0, 1), (1, 8), (8, 8), (8, 24))]
    assert (got - want).abs().max() <= LSB
    assert (torch.cat(pieces) - want).abs().max() <= LSB
    wav = 0.1 * torch.randn(1, 20000, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(ours.vae.encode(wav), ref.audio_vae.encode(wav, 16000), rtol=0, atol=1e-5)
