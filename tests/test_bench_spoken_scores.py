"""`bench asr --set qa` and `bench qa --text` scoring, without models: per-clip scores, per-condition
totals, and the transcripts file one writes and the other reads."""

from __future__ import annotations

import json

import pytest

from omniduplex.benchmarks.asr_set import condition, score, summarize
from omniduplex.benchmarks.qa import Question
from omniduplex.benchmarks.qa_text import heard_transcripts


def test_a_clip_is_scored_on_words_and_key_words():
    assert score("What is six times seven?", "What is 6 times 7?") == (0, 5, True)
    assert score("What is six times seven?", "What is time times for?") == (2, 5, False)
    assert score("Which animal says moo?", "Which animal says moo") == (0, 4, True)


def test_conditions_and_totals_per_condition():
    assert condition(Question("q", ("a",), voice="piper")) == "piper"
    assert condition(Question("q", ("a",), voice="en-gb+f4")) == "espeak"
    assert condition(Question("q", ("a",), voice="piper", channel="phone")) == "phone"
    rows = [
        {"edits": 0, "ref": 5, "key": True, "condition": "espeak", "ms": 100.0},
        {"edits": 2, "ref": 5, "key": False, "condition": "piper", "ms": 300.0},
        {"edits": 1, "ref": 10, "key": True, "condition": "noise", "ms": 200.0},
    ]
    s = summarize(rows)
    assert s["all"]["wer"] == pytest.approx(3 / 20) and s["all"]["key_heard"] == pytest.approx(2 / 3)
    assert s["clean"]["clips"] == 2 and s["clean"]["exact"] == pytest.approx(0.5)
    assert s["phone"]["clips"] == 0 and s["noise"]["wer"] == pytest.approx(0.1)
    assert s["ms_p50"] == pytest.approx(200.0)


def test_heard_transcripts_come_from_the_named_asr(tmp_path):
    f = tmp_path / "asr.json"
    rows = [{"question": "What is two plus three?", "transcript": "what is 2 plus 3"}]
    f.write_text(json.dumps({"a": {"rows": rows}, "b": {"rows": [{**rows[0], "transcript": "what"}]}}))
    assert heard_transcripts(f) == ("a", {"What is two plus three?": "what is 2 plus 3"})
    assert heard_transcripts(f, "b")[1]["What is two plus three?"] == "what"
    with pytest.raises(ValueError, match="no results of ASR 'c'"):
        heard_transcripts(f, "c")
    f.write_text("{}")
    with pytest.raises(ValueError, match="no ASR results"):
        heard_transcripts(f)
