"""LogMelFrontEnd against transformers' WhisperFeatureExtractor as Qwen3-Omni's processor drives it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import mel_filter_bank as hf_mel_filter_bank

from omniduplex.models.mel import LogMelConfig, LogMelFrontEnd, mel_filter_bank

SR = 16000
# Keys in the layout of Qwen3-Omni's preprocessor_config.json (feature-extractor part).
PREPROCESSOR_CONFIG = {
    "chunk_length": 300,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": SR,
}


@pytest.fixture(scope="module")
def reference() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(**PREPROCESSOR_CONFIG)


@pytest.fixture(scope="module")
def front_end() -> LogMelFrontEnd:
    return LogMelFrontEnd(PREPROCESSOR_CONFIG)


def reference_features(fe: WhisperFeatureExtractor, wave: np.ndarray) -> tuple[torch.Tensor, int]:
    """One utterance through the extractor with Qwen3-Omni's processor audio kwargs."""
    out = fe(wave, sampling_rate=SR, padding=True, truncation=False, return_attention_mask=True,
             return_tensors="pt")
    feats, mask = out["input_features"][0], out["attention_mask"][0]
    return feats, int(mask.sum())


def chirp(seconds: float, f0: float = 100.0, f1: float = 7900.0) -> np.ndarray:
    """Exponential sine sweep from f0 to f1 Hz, amplitude 0.5."""
    t = np.arange(int(seconds * SR)) / SR
    k = math.log(f1 / f0) / seconds
    return (0.5 * np.sin(2 * np.pi * f0 * (np.exp(k * t) - 1) / k)).astype(np.float32)


def noise(n: int, seed: int, scale: float = 0.1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def test_filter_bank_matches_slaney_reference():
    ours = mel_filter_bank(n_fft=400, n_mels=128, sampling_rate=SR)
    ref = hf_mel_filter_bank(num_frequency_bins=201, num_mel_filters=128, min_frequency=0.0,
                             max_frequency=8000.0, sampling_rate=SR, norm="slaney", mel_scale="slaney")
    assert ours.shape == (201, 128)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("wave", [noise(201, 0), noise(1600, 1), noise(16123, 2, scale=0.3),
                                  noise(3 * SR + 77, 3, scale=0.01), chirp(2.0), chirp(1.37, 300.0, 5000.0)],
                         ids=["min", "0.1s", "1s+123", "3s-quiet", "chirp", "chirp-odd"])
def test_parity_with_whisper_feature_extractor(reference, front_end, wave):
    ref, ref_frames = reference_features(reference, wave)
    feats, lens = front_end([torch.from_numpy(wave)])
    assert feats.dtype == torch.float32 and lens.dtype == torch.int64
    assert int(lens[0]) == ref_frames == ref.shape[-1] == len(wave) // 160
    assert feats.shape == (1, 128, ref_frames)
    assert (feats[0] - ref).abs().max().item() <= 1e-3


def test_batch_equals_each_alone_and_reference(reference, front_end):
    # Different lengths and loudness: per-utterance max-8 clamp must not leak across the batch.
    waves = [noise(5000, 10, scale=1.0), chirp(1.0) * 0.001, noise(16160, 11, scale=0.05), noise(999, 12)]
    feats, lens = front_end([torch.from_numpy(w) for w in waves])
    assert lens.tolist() == [len(w) // 160 for w in waves]
    assert feats.shape == (4, 128, max(lens.tolist()))
    for b, w in enumerate(waves):
        n = int(lens[b])
        alone, _ = front_end([torch.from_numpy(w)])
        assert torch.equal(feats[b, :, n:], torch.zeros_like(feats[b, :, n:]))
        assert (feats[b, :, :n] - alone[0]).abs().max().item() <= 1e-6
        ref, _ = reference_features(reference, w)
        assert (feats[b, :, :n] - ref).abs().max().item() <= 1e-3


def test_padded_tensor_input_equals_list_input(front_end):
    waves = [torch.from_numpy(noise(n, n)) for n in (4000, 2345, 3210)]
    padded = torch.nn.utils.rnn.pad_sequence(waves, batch_first=True)
    padded[1, 2345:] = 0.7  # garbage past the length must be ignored
    lengths = torch.tensor([4000, 2345, 3210])
    a, la = front_end(waves)
    b, lb = front_end(padded, lengths)
    assert torch.equal(la, lb)
    assert (a - b).abs().max().item() <= 1e-6


def test_clamps_to_eight_decades_below_peak(front_end):
    wave = np.zeros(3200, dtype=np.float32)
    wave[1000:1400] = noise(400, 5, scale=0.5)  # silence around a burst: floor must be max − 8 (log10)
    feats, _ = front_end([torch.from_numpy(wave)])
    assert math.isclose(feats.min().item(), feats.max().item() - 2.0, abs_tol=1e-6)  # (x+4)/4 scale


def test_config_and_input_errors():
    cfg = LogMelConfig.from_dict(PREPROCESSOR_CONFIG)
    assert (cfg.feature_size, cfg.sampling_rate, cfg.hop_length, cfg.n_fft) == (128, SR, 160, 400)
    with pytest.raises(ValueError, match="dither"):
        LogMelConfig.from_dict({**PREPROCESSOR_CONFIG, "dither": 1e-4})
    fe = LogMelFrontEnd()
    assert len(fe.state_dict()) == 0
    with pytest.raises(ValueError, match="201"):
        fe([torch.zeros(200)])
    with pytest.raises(ValueError, match="1-D"):
        fe([torch.zeros(2, 400)])
    with pytest.raises(ValueError, match="lengths"):
        fe(torch.zeros(2, 400), torch.tensor([400, 500]))
