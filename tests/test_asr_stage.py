"""Whisper ASR (faster-whisper / CTranslate2, real tiny.en weights) and the cascade's ASR stage worker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from speech import espeak, words_of

from omniduplex.models.cascade.asr import SAMPLE_RATE, WhisperASR
from omniduplex.models.weights import WHISPER_TINY_EN, locate
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions, TurnRequest
from omniduplex.pipeline.stages.asr import ASRWorker

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
QUESTION = EXAMPLES / "question.wav"
"""Says: "Hello? Can you tell me what the weather will be like tomorrow in Paris?" (3.9 s)."""


@pytest.fixture(scope="module")
def asr() -> WhisperASR:
    return WhisperASR(locate(WHISPER_TINY_EN).parent, cpu_threads=1)


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return load_audio(QUESTION)


def check_timings(t, duration_s: float) -> None:
    prev_end = 0.0
    for w in t.words:
        assert 0.0 <= w.start_s <= w.end_s <= duration_s + 1e-6, w
        assert w.start_s >= prev_end - 1e-6, f"{w} starts before the previous word ends ({prev_end})"
        assert 0.0 <= w.probability <= 1.0
        prev_end = w.end_s


def test_question_transcribes_with_word_timings(asr, question):
    t = asr.transcribe(question)
    said = words_of(t.text)
    for key in ("weather", "tomorrow", "paris"):
        assert key in said, t.text
    assert t.language == "en"
    assert t.duration_s == pytest.approx(question.size / SAMPLE_RATE)
    assert words_of(" ".join(w.word for w in t.words)) == said  # the words spell the text
    check_timings(t, t.duration_s)
    paris = next(w for w in t.words if "paris" in w.word.lower())
    assert paris.start_s > t.duration_s / 2  # the last word of the question is in its second half


def test_batch_equals_each_alone(asr, tmp_path):
    texts = [
        "The cat is sleeping on the warm kitchen floor.",
        "Please turn off the lights before you leave.",
        "We are going to the beach on Saturday morning.",
    ]
    waves = [espeak(tmp_path, f"u{i}", s) for i, s in enumerate(texts)]
    batch = asr.transcribe_batch(waves)
    alone = [asr.transcribe(w) for w in waves]
    for b, a, w, text in zip(batch, alone, waves, texts):
        assert b.text == a.text
        assert [x.word for x in b.words] == [x.word for x in a.words]
        np.testing.assert_allclose([x.start_s for x in b.words], [x.start_s for x in a.words], atol=0.021)
        check_timings(b, w.size / SAMPLE_RATE)
        heard = set(words_of(b.text))
        content = [x for x in words_of(text) if len(x) > 4]
        assert sum(x in heard for x in content) >= len(content) - 1, (b.text, text)


def test_silence_and_noise_give_nothing(asr):
    rng = np.random.default_rng(0)
    silence = np.zeros(2 * SAMPLE_RATE, np.float32)
    noise = (0.1 * rng.standard_normal(2 * SAMPLE_RATE)).astype(np.float32)
    loud_noise = np.clip(0.5 * rng.standard_normal(2 * SAMPLE_RATE), -1, 1).astype(np.float32)
    for t in asr.transcribe_batch([silence, noise, loud_noise]):
        assert t.text == "" and t.words == []


def test_speech_beside_silence_in_one_batch(asr, question):
    speech, silence = asr.transcribe_batch([np.zeros(SAMPLE_RATE, np.float32), question])[::-1]
    assert silence.text == "" and "paris" in words_of(speech.text)
    assert speech.words and speech.words == asr.transcribe(question).words


def test_over_30s_falls_back_to_sliding_windows(asr, question):
    gap = np.zeros(SAMPLE_RATE // 2, np.float32)
    long = np.concatenate([question, gap] * 9)  # ~39 s
    t = asr.transcribe(long)
    assert words_of(t.text).count("paris") >= 7
    check_timings(t, long.size / SAMPLE_RATE)
    assert t.words[-1].end_s > 30.0


def test_bad_waveform_raises(asr):
    with pytest.raises(ValueError):
        asr.transcribe_batch([np.zeros((2, 16000), np.float32)])
    with pytest.raises(ValueError):
        asr.transcribe_batch([np.zeros(0, np.float32)])


def test_worker_batches_turns_and_passes_meta_through(asr, question):
    w = ASRWorker(asr, max_batch=2)
    silence = torch.zeros(SAMPLE_RATE)
    turn = TurnOptions(history=[["user", "hi"]], voice="x")
    w.submit(StageMessage("a", {"waveform": torch.from_numpy(question)}, TurnRequest(turn=turn)))
    brief = TurnRequest(turn=TurnOptions(system_prompt="Be brief."))
    w.submit(StageMessage("b", {"waveform": silence}, brief))
    w.submit(StageMessage("c", {"waveform": torch.from_numpy(question)}, TurnRequest()))
    w.abort("c")
    w.submit(StageMessage("d", {"waveform": silence}, TurnRequest(turn=TurnOptions(speaker="y"))))
    assert w.has_work()
    outs = w.step()
    assert [m.request_id for m in outs] == ["a", "b"]  # max_batch: "d" waits for the next step
    a, b = outs
    assert a.last and b.last and a.tensors == {} and b.tensors == {}
    assert isinstance(a.meta, Transcript) and isinstance(b.meta, Transcript)
    assert a.meta.turn == turn and a.meta.options.history == [["user", "hi"]]  # the turn's options pass on
    assert b.meta.options.system_prompt == "Be brief."
    assert "paris" in words_of(a.meta.transcript)
    assert [x[0] for x in a.meta.words][-1].lower().startswith("paris")
    assert all(isinstance(x[0], str) and x[1] <= x[2] for x in a.meta.words)
    assert b.meta.transcript == "" and b.meta.words == []
    assert a.meta.asr_ms > 0 and a.meta.asr_ms == b.meta.asr_ms  # one batch
    (d,) = w.step()
    assert d.request_id == "d" and d.meta.options.speaker == "y" and d.meta.transcript == ""
    assert not w.has_work() and w.step() == []


@pytest.mark.parametrize(
    "wav",
    [
        torch.zeros(2, SAMPLE_RATE),  # not 1-D
        torch.zeros(SAMPLE_RATE, dtype=torch.int16),  # not float
        torch.zeros(SAMPLE_RATE // 10 - 1),  # under 0.1 s
        None,
    ],
)
def test_worker_rejects_bad_waveforms_for_that_turn_only(asr, question, wav):
    w = ASRWorker(asr)
    with pytest.raises(ValueError, match="turn bad"):
        w.submit(StageMessage("bad", {} if wav is None else {"waveform": wav}, TurnRequest()))
    w.submit(StageMessage("good", {"waveform": torch.from_numpy(question)}, TurnRequest()))
    (out,) = w.step()
    assert out.request_id == "good" and "paris" in words_of(out.meta.transcript)


def test_typed_turn_skips_transcription_and_goes_first(asr, question):
    w = ASRWorker(asr)
    w.submit(StageMessage("spoken", {"waveform": torch.from_numpy(question)}, TurnRequest()))
    typed_turn = TurnRequest(turn=TurnOptions(user_text="What is two plus two?"))
    w.submit(StageMessage("typed", {"waveform": torch.zeros(0)}, typed_turn))
    (typed,) = w.step()
    assert typed.request_id == "typed" and typed.last and typed.meta.asr_ms is None
    assert typed.meta.transcript == "What is two plus two?" and typed.meta.words == []
    (spoken,) = w.step()
    assert "paris" in words_of(spoken.meta.transcript)
