"""End-of-turn detection: Smart Turn v3.2 features against pipecat's reference, the model on spoken
sentences (espeak-ng), and the pure end-of-turn policy. Session-level tests are in test_session.py."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

from omniduplex.app.core.turn_detection import (
    SMART_TURN_FRAMES,
    SMART_TURN_MELS,
    SMART_TURN_SAMPLES,
    EndOfTurnPolicy,
    SmartTurnFeatures,
    SmartTurnModel,
    load_turn_model,
    window,
)
from omniduplex.app.core.vad import SpeechSegmenter, TurnConfig
from omniduplex.models.weights import package_dir

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("sox") is None, reason="needs espeak-ng and sox"
)

# Clear cases for the int8 model on espeak-ng at 150 words/min, measured with 0.06–0.4 s of trailing
# silence: finished 0.96–0.98, cut off 0.013–0.07 (and 0.93–0.97 / 0.008–0.05 over dithered renderings).
# espeak's flat delivery makes many other phrases ambiguous ("I would like to order a": 0.16–0.9).
FINISHED = "Please set an alarm for seven in the morning."
CUT_OFF = "Could you tell me how to get to the"


def espeak(tmp_path: Path, text: str, words_per_minute: int = 150) -> np.ndarray:
    """``text`` spoken by espeak-ng, as int16 mono at 16 kHz (espeak's own short leading/trailing silence
    included). ``sox -D``: no dither, so the audio is the same at every run (sox dithers with a fresh random
    seed by default, which moved a borderline probability between 0.23 and 0.58 from run to run)."""
    name = f"speech{len(list(tmp_path.glob('*.wav')))}"
    raw, out = tmp_path / f"{name}-raw.wav", tmp_path / f"{name}.wav"
    subprocess.run(["espeak-ng", "-s", str(words_per_minute), "-w", str(raw), text], check=True)
    subprocess.run(["sox", "-D", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True)
    with wave.open(str(out)) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).copy()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * 16000), np.int16)


def pipecat_features():
    """pipecat's vendored Whisper feature code, loaded from its file (the package ``__init__`` needs
    loguru, which is not installed; the feature module needs only numpy)."""
    root = package_dir("pipecat")  # installed apart by scripts/install.sh (models/weights.py)
    if root is None:
        pytest.skip("pipecat-ai is not installed")
    path = root / "audio/turn/smart_turn/_whisper_features.py"
    mod_spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.compute_whisper_log_mel_features


@pytest.fixture(scope="module")
def model() -> SmartTurnModel:
    return SmartTurnModel()


# -- features ---------------------------------------------------------------------------------------
def test_window_keeps_the_last_8_s_and_pads_at_the_start():
    short = np.arange(1, 1001, dtype=np.float32)
    w = window(short)
    assert w.shape == (SMART_TURN_SAMPLES,) and w.dtype == np.float32
    assert not w[:-1000].any() and np.array_equal(w[-1000:], short)
    long = np.arange(SMART_TURN_SAMPLES + 500, dtype=np.float32)
    assert np.array_equal(window(long), long[500:])
    with pytest.raises(ValueError, match="1-D"):
        window(np.zeros((2, 100), np.float32))


@needs_espeak
def test_features_match_pipecat_reference(tmp_path):
    reference = pipecat_features()
    ours = SmartTurnFeatures()
    speech = espeak(tmp_path, FINISHED).astype(np.float32) / 32768.0
    rng = np.random.default_rng(0)
    cases = {
        "speech, padded": np.concatenate([speech, np.zeros(3200, np.float32)]),
        "noise, 9 s, truncated": (0.1 * rng.standard_normal(9 * 16000)).astype(np.float32),
        "exactly 8 s": np.resize(speech, SMART_TURN_SAMPLES),
    }
    for name, audio in cases.items():
        got = ours(audio)
        want = reference(window(audio), do_normalize=True)
        assert got.shape == want.shape == (SMART_TURN_MELS, SMART_TURN_FRAMES), name
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5, err_msg=name)


# -- the model --------------------------------------------------------------------------------------
def test_model_io_is_80_by_800_features_to_one_probability(model):
    (inp,) = model.session.get_inputs()
    assert inp.name == "input_features" and inp.shape[1:] == [SMART_TURN_MELS, SMART_TURN_FRAMES]
    p = model.probability(np.zeros(16000, np.float32))
    assert isinstance(p, float) and 0.0 <= p <= 1.0


@needs_espeak
def test_model_tells_a_finished_sentence_from_a_cut_off_phrase(model, tmp_path):
    def p(text: str, trailing_s: float) -> float:
        wav = np.concatenate([silence(0.2), espeak(tmp_path, text), silence(trailing_s)])
        return model.probability(wav.astype(np.float32) / 32768.0)

    for trailing in (0.1, 0.2, 0.3):
        assert p(FINISHED, trailing) > 0.8, trailing  # measured 0.96–0.98
        assert p(CUT_OFF, trailing) < 0.2, trailing  # measured ≤ 0.07


def test_load_turn_model_follows_the_config():
    assert load_turn_model(TurnConfig()) is None
    assert isinstance(load_turn_model(TurnConfig(turn_detection="smart")), SmartTurnModel)


# -- the policy (pure) ------------------------------------------------------------------------------
SMART = EndOfTurnPolicy("smart", endpoint_ms=500, check_ms=200, max_silence_ms=2000, threshold=0.5)


def test_policy_checks_once_at_check_ms_and_ends_when_complete():
    assert SMART.decide(0, 1000) == "wait"
    assert SMART.decide(180, 1000) == "wait"
    assert SMART.decide(200, 1000) == "check"
    assert SMART.decide(220, 1000, checked=True) == "wait"  # verdict pending
    assert SMART.decide(220, 1000, checked=True, probability=0.5) == "end"  # p ≥ threshold
    assert SMART.decide(220, 1000, checked=True, probability=0.97) == "end"


def test_policy_waits_through_a_pause_the_model_calls_incomplete_then_falls_back():
    actions = [SMART.decide(ms, 1000, checked=True, probability=0.1) for ms in range(200, 2000, 20)]
    assert set(actions) == {"wait"}
    assert SMART.decide(2000, 1000, checked=True, probability=0.1) == "end"
    assert SMART.decide(2000, 1000, checked=True) == "end"  # the model failed or is still running
    assert SMART.silence_limit_ms == 2000  # the segmenter's own endpoint, the same fallback


def test_policy_uses_plain_endpointing_over_a_reply_and_for_noise():
    for kw in ({"replying": True}, {}):
        speech_ms = 1000 if kw else 100  # replying, or less than min_turn_ms of speech
        assert SMART.decide(200, speech_ms, **kw) == "wait"
        assert SMART.decide(480, speech_ms, **kw) == "wait"
        assert SMART.decide(500, speech_ms, **kw) == "end"


def test_silence_mode_is_plain_endpointing():
    policy = EndOfTurnPolicy.from_config(TurnConfig(endpoint_ms=300))
    assert policy.mode == "silence" and policy.silence_limit_ms == 300
    assert [policy.decide(ms, 1000) for ms in (0, 200, 280, 300)] == ["wait", "wait", "wait", "end"]
    assert policy.decide(200, 1000, checked=True, probability=0.99) == "wait"  # verdicts are ignored


def test_turn_config_validates_smart_fields():
    with pytest.raises(ValueError, match="turn_detection"):
        TurnConfig(turn_detection="model")
    with pytest.raises(ValueError, match="smart_max_silence_ms"):
        TurnConfig(smart_check_ms=300, smart_max_silence_ms=300)
    with pytest.raises(ValueError, match="smart_threshold"):
        TurnConfig(smart_threshold=1.5)


def test_segmenter_endpoint_override_and_end_on_demand():
    seg = SpeechSegmenter(TurnConfig(start_ms=20, endpoint_ms=100), endpoint_ms=200)
    assert seg.update(True) == "start"
    assert [seg.update(False) for _ in range(9)] == [None] * 9  # 180 ms: past cfg.endpoint_ms, not 200
    assert seg.trailing_silence_ms == 180
    assert seg.end() is True and not seg.in_speech and seg.speech_ms == 20
    assert seg.end() is False and seg.trailing_silence_ms == 0
    assert seg.update(True) == "start"  # the next segment opens as usual
