"""DAC codec: decoder and encoder parity with ``transformers.DacModel``, checkpoint name variants, streaming
decode, the unified preset's codec round trip, load and input errors."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from transformers import DacConfig, DacModel

from omniduplex.models.checkpoint import CheckpointError, weight_files
from omniduplex.models.codecs.dac import DacCodec, DacDecoderConfig, load_codec_into
from omniduplex.models.codecs.dac_encoder import DacCodecEncoder, DacEncoderConfig, load_codec_encoder_into
from omniduplex.models.codecs.dac_stream import DacDecodeStream
from omniduplex.models.unified.presets import write_unified_checkpoint

CONFIGS = {
    # even strides: T·hop samples; odd stride: transformers' conv-transpose padding drops samples
    "even": dict(
        encoder_hidden_size=4,
        downsampling_ratios=[2, 4],
        decoder_hidden_size=32,
        n_codebooks=3,
        codebook_size=16,
        codebook_dim=4,
    ),
    "odd": dict(
        encoder_hidden_size=2,
        downsampling_ratios=[2, 3, 2],
        decoder_hidden_size=32,
        n_codebooks=4,
        codebook_size=32,
        codebook_dim=6,
    ),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny convs: intra-op threading only adds barrier waits (very slow on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _reference(name: str, weight_norm: bool, seed: int = 0) -> DacModel:
    """A tiny ``DacModel`` with every parameter drawn from a seeded generator.

    Conv kernels N(0, (0.6/√fan_in)²), biases N(0, 0.05²), codebooks N(0, 1), Snake α U(0.5, 1.5),
    weight-norm magnitudes g U(0.5, 1.5) (so ``g`` is not just ``‖v‖``).
    """
    model = DacModel(DacConfig(**CONFIGS[name])).eval()
    if weight_norm:
        model.apply_weight_norm()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if pname.endswith("alpha") or pname.endswith("original0"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif pname.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif pname.endswith("codebook.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[1] * p.shape[2] if p.dim() == 3 else p.shape[-1]
                p.copy_(0.6 * fan_in**-0.5 * torch.randn(p.shape, generator=g))
    return model


def _state(model: DacModel, legacy: bool = False) -> dict[str, torch.Tensor]:
    """``model``'s tensors under ``codec.``; ``legacy``: original DAC / older ``transformers`` weight-norm
    names (``weight_g`` / ``weight_v``)."""
    sd = {f"codec.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if legacy:
        sd = {
            k.replace("parametrizations.weight.original0", "weight_g").replace(
                "parametrizations.weight.original1", "weight_v"
            ): v
            for k, v in sd.items()
        }
    return sd


def _ours_from(model: DacModel, tmp_path, rename_legacy: bool = False) -> DacCodec:
    sd = _state(model, rename_legacy)
    assert any(k.startswith("codec.encoder.") for k in sd)  # encoder tensors present, ignored
    save_file(sd, str(tmp_path / "model.safetensors"))
    ours = DacCodec(DacDecoderConfig.from_dict(model.config.to_dict())).eval()
    load_codec_into(ours, weight_files(tmp_path), prefix="codec.")
    return ours


def _codes(cfg: dict, t: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["codebook_size"], (2, cfg["n_codebooks"], t), generator=g)


@pytest.mark.parametrize(
    "name,weight_norm,legacy",
    [("even", False, False), ("even", True, False), ("odd", True, True)],
)
@torch.no_grad()
def test_decode_matches_transformers(tmp_path, name, weight_norm, legacy):
    ref = _reference(name, weight_norm)
    ours = _ours_from(ref, tmp_path, rename_legacy=legacy)
    codes = _codes(CONFIGS[name], 13)
    want = ref.decode(audio_codes=codes).audio_values  # [B, L]
    got = ours.decode(codes)
    assert got.shape == (2, 1, ours.output_length(13)) == (2, 1, want.shape[-1])
    if name == "even":
        assert got.shape[-1] == 13 * ours.hop_length
    assert want.abs().max() > 0.05  # not a silent decoder
    torch.testing.assert_close(got[:, 0], want, atol=1e-4, rtol=0)


def test_loader_errors(tmp_path):
    ref = _reference("even", weight_norm=True)
    sd = _state(ref)
    half = "codec.decoder.conv1.parametrizations.weight.original0"
    ours = DacCodec(DacDecoderConfig.from_dict(ref.config.to_dict()))
    save_file({k: v for k, v in sd.items() if k != half}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="decoder.conv1.weight"):
        load_codec_into(ours, weight_files(tmp_path))
    sd["codec.decoder.extra.weight"] = torch.zeros(1)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="codec.decoder.extra.weight"):
        load_codec_into(ours, weight_files(tmp_path))


@pytest.mark.parametrize("name", ["even", "odd"])
@torch.no_grad()
def test_stateful_stream_equals_one_shot_for_any_split(tmp_path, name):
    ours = _ours_from(_reference(name, weight_norm=False), tmp_path)
    codes = _codes(CONFIGS[name], 29)  # two different streams in one batch
    full = ours.decode(codes)
    for split in ([29], [1] * 29, [5, 11, 0, 3, 10], [2, 2, 2, 23]):
        stream, outs, i = DacDecodeStream(ours, batch=2), [], 0
        for n in split:
            outs.append(stream.push(codes[..., i : i + n]))
            i += n
        outs.append(stream.flush())
        torch.testing.assert_close(torch.cat(outs, dim=-1), full, atol=1e-5, rtol=0)
    # the convs are centred: a frame's samples come out only after the decoder's look-ahead
    stream = DacDecodeStream(ours, batch=2)
    assert stream.push(codes[..., :1]).shape[-1] < ours.output_length(1)


def test_stream_refuses_bad_codes_and_use_after_flush(tmp_path):
    ours = _ours_from(_reference("even", weight_norm=False), tmp_path)
    stream = DacDecodeStream(ours)
    with pytest.raises(ValueError, match="code ids"):
        stream.push(torch.full((1, 2, 3), CONFIGS["even"]["codebook_size"]))
    with pytest.raises(ValueError, match=r"\[1, S, n\]"):
        stream.push(torch.zeros(2, 2, 3, dtype=torch.int64))
    stream.push(torch.zeros(1, 2, 3, dtype=torch.int64))  # a refused push left the stream usable
    stream.flush()
    with pytest.raises(ValueError, match="ended"):
        stream.push(torch.zeros(1, 2, 1, dtype=torch.int64))


# -- encode side (models/codecs/dac_encoder.py) --------------------------------------------------------------
def _encoder_from(model: DacModel, tmp_path, legacy: bool = False) -> DacCodecEncoder:
    save_file(_state(model, legacy), str(tmp_path / "model.safetensors"))
    ours = DacCodecEncoder(DacEncoderConfig.from_dict(model.config.to_dict())).eval()
    load_codec_encoder_into(ours, weight_files(tmp_path), prefix="codec.")
    return ours


def _inputs(hop: int) -> dict[str, torch.Tensor]:
    """Random N(0, 0.3²) noise and a 0.5-amplitude sine of period 7.3 samples, ``[2, 1, L]``."""
    g = torch.Generator().manual_seed(1)
    n = 40 * hop
    t = torch.arange(n, dtype=torch.float32)
    sine = 0.5 * torch.sin(2 * math.pi * t / 7.3 + torch.tensor([[0.0], [1.0]]))
    return {"random": 0.3 * torch.randn(2, 1, n, generator=g), "sine": sine[:, None]}


@pytest.mark.parametrize(
    "name,weight_norm,legacy",
    [("even", False, False), ("even", True, False), ("odd", True, True)],
)
@torch.no_grad()
def test_encode_matches_transformers(tmp_path, name, weight_norm, legacy):
    ref = _reference(name, weight_norm)
    ours = _encoder_from(ref, tmp_path, legacy)
    n_cb = CONFIGS[name]["n_codebooks"]
    for kind, wav in _inputs(ours.hop_length).items():
        torch.testing.assert_close(ours.encode_latents(wav), ref.encoder(wav), atol=1e-4, rtol=0)
        for n_q in (n_cb, 2):
            want = ref.encode(wav, n_quantizers=n_q).audio_codes
            got = ours.encode(wav, n_q)
            assert got.dtype == torch.int64 and got.shape == (2, n_q, 40), kind
            assert torch.equal(got, want), (kind, n_q, (got != want).sum().item())
        assert got[:, 0].unique().numel() > 2, kind  # the codes carry information
        # not a multiple of hop: we zero-pad on the right as DacFeatureExtractor does; DacModel does not
        cut = wav[..., : 37 * ours.hop_length - 3]
        padded = torch.nn.functional.pad(cut, (0, 3))
        assert torch.equal(ours.encode(cut), ref.encode(padded).audio_codes), kind
        assert ours.encode(cut).shape[-1] == ours.num_frames(cut.shape[-1]) == 37


@torch.no_grad()
def test_unified_preset_round_trip(tmp_path):
    ckpt = write_unified_checkpoint(tmp_path, "tiny", seed=0)
    config = json.loads((ckpt / "config.json").read_text())
    s, cc = config["num_streams"], config["codec_config"]
    files = weight_files(ckpt)
    enc = DacCodecEncoder(DacEncoderConfig.from_dict(cc)).eval()
    load_codec_encoder_into(enc, files)
    dec = DacCodec(DacDecoderConfig.from_dict(cc)).eval()
    load_codec_into(dec, files)  # the encode-side tensors are still ignored by the decoder
    hop, sr = enc.hop_length, cc["sampling_rate"]
    for samples in (hop, 3 * hop + 17, 1):
        assert enc.num_frames(samples) == math.ceil(samples / hop)
    samples = 3 * hop + 17
    t = torch.arange(samples) / sr
    wav = (0.4 * torch.sin(2 * math.pi * 220.0 * t) + 0.05 * torch.randn(samples))[None, None]
    codes = enc.encode(wav, n_q=s)
    assert codes.shape == (1, s, math.ceil(samples / hop)) and codes.dtype == torch.int64
    assert int(codes.min()) >= 0 and int(codes.max()) < cc["codebook_size"]
    out = dec.decode(codes)
    assert out.shape == (1, 1, codes.shape[-1] * hop) and out.isfinite().all()


def test_encoder_loader_and_input_errors(tmp_path):
    ref = _reference("even", weight_norm=False)
    sd = _state(ref)
    ours = DacCodecEncoder(DacEncoderConfig.from_dict(ref.config.to_dict()))
    gone = "codec.encoder.block.1.res_unit2.conv1.weight"
    save_file({k: v for k, v in sd.items() if k != gone}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'codec\.encoder\.block\.1\.res_unit2\.conv1"):
        load_codec_encoder_into(ours, weight_files(tmp_path))
    bad = dict(sd, **{"codec.quantizer.quantizers.0.in_proj.weight": torch.zeros(4, 15, 1)})
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"quantizers\.0\.in_proj\.weight' has shape \[4, 15, 1\]"):
        load_codec_encoder_into(ours, weight_files(tmp_path))
    extra = dict(sd, **{"codec.quantizer.quantizers.3.in_proj.bias": torch.zeros(4)})
    save_file(extra, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"quantizers\.3\.in_proj\.bias' is not part of the codec enc"):
        load_codec_encoder_into(ours, weight_files(tmp_path))
    wn = _state(_reference("even", weight_norm=True))
    half = "codec.encoder.conv2.parametrizations.weight.original1"
    save_file({k: v for k, v in wn.items() if k != half}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'codec\.encoder\.conv2\.weight' has only its \['g'\] half"):
        load_codec_encoder_into(ours, weight_files(tmp_path))
    with pytest.raises(ValueError, match="n_q=4"):
        ours.encode(torch.zeros(1, 1, 8), n_q=4)
    with pytest.raises(ValueError, match=r"\[B, 1, samples\]"):
        ours.encode(torch.zeros(1, 8))
    with pytest.raises(ValueError, match="no samples"):
        ours.encode(torch.zeros(1, 1, 0))
