"""Code2Wav: parity with transformers' Qwen3OmniMoeCode2Wav, and exact stateful streaming decode."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from omniduplex.models.qwen3_omni.code2wav import Code2Wav
from omniduplex.models.qwen3_omni.code2wav_config import Code2WavConfig
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream, chunked_decode

# Tiny layouts of the published architecture. ``peak`` is the waveform peak the last conv is scaled to:
# below 1 so tolerances are meaningful, above 1 to exercise the clamp.
CONFIGS = {
    "a": dict(cfg=dict(codebook_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                       sliding_window=4, intermediate_size=64, num_hidden_layers=2, num_quantizers=4,
                       upsample_rates=[4, 4, 3, 2], upsampling_ratios=[2, 2], decoder_dim=32,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
              seed=0, peak=0.5),
    "b": dict(cfg=dict(codebook_size=2048, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                       sliding_window=6, intermediate_size=96, num_hidden_layers=2, num_quantizers=8,
                       upsample_rates=[5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=64,
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0}, rms_norm_eps=1e-6),
              seed=1, peak=1.5),
}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Draw every parameter from a seeded generator (transformers leaves some tensors uninitialised).

    Linear/embedding matrices N(0, 0.05²); conv kernels N(0, (0.5/√fan_in)²) so activations stay O(1);
    biases N(0, 0.02²); norm weights 1 + N(0, 0.02²); SnakeBeta log-α/log-β N(0, 0.1²) (log scale, 0 ↔ 1);
    layer scale and ConvNeXt γ U(0.5, 1) so the transformer and ConvNeXt branches matter (init is 0.01/1e-6).
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith((".alpha", ".beta")):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith((".scale", ".gamma")):
                p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=g))
            elif p.dim() == 1:
                base = 1.0 if "norm" in name else 0.0
                p.copy_(base + 0.02 * torch.randn(p.shape, generator=g))
            elif p.dim() == 3:
                transposed = ".block.1." in name or (name.startswith("upsample.") and ".0.conv." in name)
                fan_in = p.shape[0] * p.shape[2] if transposed else p.shape[1] * p.shape[2]
                p.copy_(0.5 / math.sqrt(fan_in) * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def _scale_output(model: Qwen3OmniMoeCode2Wav, codes: torch.Tensor, peak: float) -> None:
    """Scale the last (linear) conv so the pre-clamp waveform of ``codes`` peaks at ``peak``."""
    seen = []
    handle = model.decoder[-1].register_forward_hook(lambda _m, _i, out: seen.append(out.abs().max().item()))
    with torch.no_grad():
        model(codes)
        handle.remove()
        model.decoder[-1].conv.weight.mul_(peak / seen[0])
        model.decoder[-1].conv.bias.mul_(peak / seen[0])


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    spec = CONFIGS[request.param]
    hf = Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig(**spec["cfg"])).eval()
    _randomize(hf, spec["seed"])
    g = torch.Generator().manual_seed(100 + spec["seed"])
    shape = (2, spec["cfg"]["num_quantizers"], 40)
    codes = torch.randint(0, spec["cfg"]["codebook_size"], shape, generator=g)
    _scale_output(hf, codes[..., :8], spec["peak"])
    ours = Code2Wav(Code2WavConfig.from_dict(spec["cfg"])).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours, codes


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert got.shape == ref.shape
    assert float((got - ref).abs().max()) <= tol * max(1.0, float(ref.abs().max()))


def test_state_dict_names_are_the_published_ones(pair):
    hf, ours, _ = pair
    assert list(ours.state_dict()) and set(ours.state_dict()) == set(hf.state_dict())
    assert ours.total_upsample == int(hf.total_upsample)


@torch.no_grad()
def test_forward_matches_transformers(pair):
    hf, ours, codes = pair
    ref = hf(codes)
    got = ours(codes)
    assert got.dtype == torch.float32
    assert got.shape == (2, 1, ours.num_samples(40))
    assert ours.num_samples(40) == 40 * ours.total_upsample - ours.lookahead_samples
    assert float(ref.abs().max()) > 0.2  # a real signal, so the tolerance below is meaningful
    _close(got, ref, 1e-4)


@torch.no_grad()
@pytest.mark.parametrize("chunk,left", [(1, 0), (7, 3), (9, 25), (40, 25), (13, 40)])
def test_chunked_decode_matches_transformers(pair, chunk, left):
    hf, ours, codes = pair
    ref = hf.chunked_decode(codes, chunk_size=chunk, left_context_size=left)
    _close(chunked_decode(ours, codes, chunk, left), ref, 1e-4)


def _stream(model: Code2Wav, codes: torch.Tensor, split: list[int]) -> list[torch.Tensor]:
    stream, outs, i = Code2WavStream(model, batch=codes.shape[0]), [], 0
    for n in split:
        outs.append(stream.push(codes[..., i : i + n]))
        i += n
    return outs + [stream.flush()]


@torch.no_grad()
@pytest.mark.parametrize("split", [[40], [1] * 40, [2] + [8] * 4 + [6], [3, 0, 16, 21]])
def test_stateful_stream_equals_one_shot_for_any_split(pair, split):
    _, ours, codes = pair
    one_shot, outs = ours(codes), _stream(ours, codes, split)
    _close(torch.cat(outs, dim=-1), one_shot, 1e-5)
    # causal: after n frames the stream has given exactly the one-shot decode of those n frames
    sizes = torch.tensor([o.shape[-1] for o in outs[:-1]]).cumsum(0).tolist()
    frames = torch.tensor(split).cumsum(0).tolist()
    assert sizes == [ours.num_samples(n) if n else 0 for n in frames]
    assert outs[-1].shape[-1] == 0  # the flush adds nothing: the one-shot decode trims that tail too


@torch.no_grad()
def test_stream_refuses_bad_codes_and_use_after_flush(pair):
    _, ours, codes = pair
    stream = Code2WavStream(ours, batch=2)
    bad = codes[..., :3].clone()
    bad[0, 1, 1] = ours.cfg.codebook_size
    with pytest.raises(ValueError, match="codebook 1"):
        stream.push(bad)
    with pytest.raises(ValueError, match="batch|\\[2, Q, n\\]"):
        stream.push(codes[:1, :, :3])
    assert stream.push(codes[..., :3]).shape[-1] == ours.num_samples(3)  # refused pushes left no trace
    stream.flush()
    with pytest.raises(ValueError, match="ended"):
        stream.push(codes[..., 3:4])


@torch.no_grad()
def test_short_left_context_is_only_approximate(pair):
    """What the stream replaces: re-decoding windows with too little left context (1 frame) is not exact."""
    _, ours, codes = pair
    one_shot, u, la = ours(codes), ours.total_upsample, ours.lookahead_samples
    got = chunked_decode(ours, codes, 5, 1)
    keep = torch.ones(one_shot.shape[-1], dtype=torch.bool)
    for boundary in range(5, 40, 5):
        keep[boundary * u - la : boundary * u] = False
    assert float((got - one_shot[..., keep]).abs().max()) > 1e-3


@torch.no_grad()
def test_chunked_decode_drops_the_lookahead_tail_of_every_chunk(pair):
    _, ours, codes = pair
    one_shot, u, la = ours(codes), ours.total_upsample, ours.lookahead_samples
    chunk = 12  # chunks [0,12) [12,24) [24,36) [36,40)
    keep = torch.ones(one_shot.shape[-1], dtype=torch.bool)
    for boundary in (12, 24, 36):
        keep[boundary * u - la: boundary * u] = False
    got = chunked_decode(ours, codes, chunk, ours.receptive_field_frames)
    _close(got, one_shot[..., keep], 1e-5)


def test_receptive_field_frames_is_exact(pair):
    """The window's first sample reads frame ``start − receptive_field_frames`` and nothing earlier."""
    _, ours, codes = pair
    model = Code2Wav(ours.cfg).double().eval()
    model.load_state_dict(ours.state_dict())
    hidden = model.embed(codes[:1]).detach().requires_grad_(True)
    wav = model.synthesize(hidden)
    start = 36
    first = start * model.total_upsample - model.lookahead_samples  # the first sample a window at start owns
    assert abs(wav[0, 0, first].item()) < 1.0  # not clamped, so the gradient flows
    (grad,) = torch.autograd.grad(wav[0, 0, first], hidden)
    reached = grad[0].abs().sum(-1).nonzero().flatten()
    assert int(reached.min()) == start - model.receptive_field_frames
    assert int(reached.max()) == start


def test_out_of_range_code_ids_raise(pair):
    _, ours, codes = pair
    size = ours.cfg.codebook_size
    for value in (size, -1):
        bad = codes.clone()
        bad[1, 2, 5] = value
        with pytest.raises(ValueError, match=rf"codebook 2 has id {value}.*\[0, {size}\)"):
            ours(bad)
    with pytest.raises(ValueError, match="must be"):
        ours(codes[:, :-1])


def test_config_defaults_and_published_geometry():
    ref = Qwen3OmniMoeCode2WavConfig()
    ours = Code2WavConfig.from_dict({"codebook_dim": 512, "model_type": ""})  # unknown keys are ignored
    for name in ("codebook_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                 "sliding_window", "intermediate_size", "num_hidden_layers", "num_quantizers", "decoder_dim",
                 "rms_norm_eps", "layer_scale_initial_scale", "attention_bias", "max_position_embeddings"):
        assert getattr(ours, name) == getattr(ref, name), name
    assert ours.upsample_rates == tuple(ref.upsample_rates)
    assert ours.upsampling_ratios == tuple(ref.upsampling_ratios)
    assert ours.rope_theta == ref.rope_parameters["rope_theta"]
    assert Code2WavConfig.from_dict({"rope_theta": 123.0}).rope_theta == 123.0
    # Published rates with tiny widths: 24 kHz / 12.5 Hz and 8 layers × (72 − 1) frames of attention reach.
    small = Code2Wav(Code2WavConfig(codebook_size=8, hidden_size=16, num_attention_heads=2,
                                    num_key_value_heads=2, intermediate_size=16, decoder_dim=32))
    assert small.total_upsample == 1920
    assert small.lookahead_samples == 480 + 60 + 12 + 3
    assert small.receptive_field_frames > 8 * 71
