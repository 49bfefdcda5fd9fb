"""``bench qa``: answer matching, the question set, and (slow) two questions through the default cascade."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from omniduplex.benchmarks.qa import Answer, Question, ask, is_right, load_questions, summarize, words
from omniduplex.benchmarks.spoken_set import key_heard, key_words
from omniduplex.pipeline.events import ReplyDone, ReplyFailed, ReplyTextDelta, UserTranscript


@pytest.mark.parametrize(
    "reply, answers",
    [
        ("Two plus three is 5.", ["5", "five"]),
        ("That makes five!", ["5", "five"]),
        ("There are twenty-four hours in a day.", ["24", "twenty four"]),
        ("PARIS is the capital.", ["paris"]),
        ("Plants absorb carbon-dioxide.", ["carbon dioxide", "co2"]),
        ("They take in CO2 from the air", ["carbon dioxide", "co2"]),
        ("It boils at 100 degrees.", ["100", "hundred"]),
        ("It boils at one hundred degrees Celsius.", ["100", "hundred"]),
        ("About 1,000 of them.", ["1000"]),
    ],
)
def test_an_accepted_form_anywhere_in_the_reply_is_right(reply, answers):
    assert is_right(reply, answers)


@pytest.mark.parametrize(
    "reply, answers",
    [
        ("two plus three is a classic arithmetic operation.", ["5", "five"]),
        ("It is 56.", ["5", "five"]),  # a number is a whole word: 5 is not in 56
        ("She is fivefold better.", ["five"]),  # nor a word inside another word
        ("Carbon is an element; dioxide too.", ["carbon dioxide"]),  # a phrase's words must be adjacent
        ("Twenty hours and four minutes", ["twenty four"]),
        ("1.5 litres", ["5"]),  # a decimal is one number
        ("", ["paris"]),
    ],
)
def test_a_reply_without_an_accepted_form_is_wrong(reply, answers):
    assert not is_right(reply, answers)


def test_words_split_hyphens_and_keep_numbers_whole():
    assert words("Twenty-four, 1,000 and 3.5 degrees!") == ["24", "1000", "and", "3.5", "degrees"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("one hundred and twenty minutes", ["120", "minutes"]),
        ("eleven times eleven is one hundred twenty-one", ["11", "times", "11", "is", "121"]),
        ("count: one, two, three", ["count", "1", "2", "3"]),  # a unit after a unit starts a new number
        ("twenty twenty", ["20", "20"]),
        ("a hundred", ["a", "100"]),
        ("two thousand and five", ["2005"]),
        ("bread and butter", ["bread", "and", "butter"]),
        ("What colour is it?", ["what", "color", "is", "it"]),
        ("Which aeroplane's grey?", ["which", "airplane", "is", "gray"]),  # Whisper's spellings, contractions
        ("What's twelve minus five?", ["what", "is", "12", "minus", "5"]),  # the operator stays a word
        ("Um, count from 1 to five.", ["count", "from", "1", "to", "5"]),  # fillers dropped
    ],
)
def test_spelled_numbers_become_digits(text, expected):
    assert words(text) == expected


def test_a_rejected_form_beside_the_right_one_is_wrong():
    answers, reject = ("blue whale", "whale"), ("elephant",)
    assert is_right("The blue whale is the largest.", answers, reject)
    assert not is_right("The elephant, or maybe the blue whale.", answers, reject)
    assert is_right("Forty-two.", ["42"]) and is_right("It is one hundred and twenty.", ["120"])


def test_key_words_are_the_content_words_and_all_must_be_heard():
    assert key_words("What is the capital of France?") == ["capital", "france"]
    assert key_words("What is six times seven?") == ["6", "times", "7"]
    assert key_heard("What is six times seven?", "what is 6 times 7")
    assert not key_heard("What is six times seven?", "what is time times 4")
    assert key_heard("What colour is the sky?", "What color is the sky")
    assert key_heard("What is the opposite of up?", "What's the opposite of up")
    assert not key_heard("What is ten minus four?", "What is ten plus four?")
    assert not key_heard("What do we call water when it freezes?", "What do we call water when it's freezing")


def test_bad_answers_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        is_right("Paris", [])
    with pytest.raises(ValueError, match="no words"):
        is_right("Paris", ["?!"])


def test_the_question_set_is_varied_and_never_contains_its_own_answer():
    qs = load_questions()  # raises if a question contains one of its accepted answers
    assert len(qs) >= 100
    assert len({q.text for q in qs}) == len(qs)
    assert len({q.voice.split("+")[0] for q in qs}) >= 5  # voices (accents)
    assert len({q.voice for q in qs}) >= 10  # voices with their variants
    assert len({q.speed for q in qs}) >= 5 and len({q.pitch for q in qs}) >= 5
    kinds = {k: sum(q.kind == k for q in qs) for k in ("fact", "arithmetic", "common sense", "instruction")}
    assert min(kinds.values()) >= 10 and sum(q.kind == "small talk" for q in qs) >= 5
    assert sum(q.voice == "piper" for q in qs) >= 20
    assert sum(q.channel == "phone" for q in qs) >= 20 and sum(q.channel == "noise" for q in qs) >= 20
    assert all(q.text.strip() == q.text and q.answers for q in qs)


def test_a_question_that_contains_its_answer_is_refused(tmp_path):
    f = tmp_path / "q.yaml"
    f.write_text("questions:\n  - {text: 'Is Paris the capital of France?', answers: [paris]}\n")
    with pytest.raises(ValueError, match="contains its own answer"):
        load_questions(f)
    f.write_text("questions:\n  - {text: 'Goodbye!', answers: [goodbye], echo_ok: true}\n")
    assert load_questions(f)[0].answers == ("goodbye",)  # a farewell said back is the right reply
    f.write_text("questions:\n  - {text: 'What is the capital of France?', answers: []}\n")
    with pytest.raises(ValueError, match="at least one answer"):
        load_questions(f)


def test_summary_counts_failed_turns_as_wrong():
    q = Question("What is two plus three?", ("5", "five"))
    heard = "what is two plus three"
    ok = Answer(q.text, heard, "It is five.", True, 0.0, {"ttfp_ms": 100.0, "asr_ms": 40.0})
    wrong = Answer(q.text, "what is two plus tree", "Six.", False, 0.2, {"ttfp_ms": 300.0, "asr_ms": 60.0})
    failed = Answer(q.text, "", "", False, 1.0, None, "stage failure")
    s = summarize([ok, wrong, failed])
    assert (s["asked"], s["right"], s["errors"]) == (3, 1, 1)
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["asr_wer"] == pytest.approx(0.4)
    assert (s["heard"], s["right_when_heard"]) == (1, 1)  # only the first turn was heard word for word
    assert s["ttfp_ms_p50"] == pytest.approx(200.0) and s["asr_ms_p50"] == pytest.approx(50.0)


class ScriptedOrchestrator:
    """Answers every turn with the same events (an orchestrator's ``submit`` / ``events`` surface)."""

    def __init__(self, events):
        self.script, self.submitted = events, []

    def submit(self, wav, meta):
        self.submitted.append((wav, meta))
        return "turn-1"

    async def events(self, rid):
        for ev in self.script:
            yield ev


def test_ask_scores_the_whole_reply_text_and_keeps_the_metrics():
    q = Question("What is two plus three?", ("5", "five"))
    orch = ScriptedOrchestrator(
        [
            UserTranscript(" What is two plus three?", request_id="turn-1"),
            ReplyTextDelta("Two plus three is fi", "turn-1"),
            ReplyTextDelta("ve.", "turn-1"),  # the answer spans two deltas
            ReplyDone({"ttfp_ms": 420.0, "e2el_ms": 900.0}, "turn-1"),
        ]
    )
    a = asyncio.run(ask(orch, q, "wav", {"sampling": {}}))
    assert orch.submitted == [("wav", {"sampling": {}})]
    assert (a.reply, a.right, a.wer, a.error) == ("Two plus three is five.", True, 0.0, None)
    assert a.metrics == {"ttfp_ms": 420.0, "e2el_ms": 900.0}
    failed = ScriptedOrchestrator([ReplyFailed("stage failure", "turn-1")])
    a = asyncio.run(ask(failed, q, "wav", {}))
    assert (a.right, a.metrics, a.error, a.wer) == (False, None, "stage failure", 1.0)


@pytest.mark.slow
def test_two_questions_through_the_default_cascade(tmp_path):
    from omniduplex.cli.main import cli

    out = tmp_path / "qa.json"
    res = CliRunner().invoke(cli, ["bench", "qa", "--limit", "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "bench qa summary" in res.output
    [(model, r)] = json.loads(out.read_text()).items()
    assert model.endswith(".yaml")
    questions = load_questions()[:2]
    answers = r["answers"]
    assert [a["question"] for a in answers] == [q.text for q in questions]
    for q, a in zip(questions, answers):
        assert a["error"] is None
        heard = set(words(a["transcript"]))
        assert len(heard & set(words(q.text))) >= 2, a["transcript"]  # the ASR heard the spoken question
        assert words(a["reply"]), a  # a reply in words
        assert a["right"] == is_right(a["reply"], q.answers)  # scored on its text
        m = a["metrics"]
        assert 0 < m["ttfp_ms"] <= m["e2el_ms"]
        assert {"asr_ms", "llm_first_clause_ms", "tts_first_chunk_ms"} <= set(m)
    s = r["summary"]
    assert s["asked"] == 2 and s["right"] == sum(a["right"] for a in answers)
    assert s["ttfp_ms_p50"] > 0


@pytest.mark.slow
def test_text_mode_asks_the_llm_alone_and_scores_each_kind(tmp_path):
    from omniduplex.cli.main import cli

    out = tmp_path / "qa-text.json"
    args = ["bench", "qa", "--text", "--model", "small", "--limit", "3", "--json", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "bench qa --text: 3 questions typed, temperature 0.0" in res.output
    [(label, r)] = json.loads(out.read_text()).items()
    assert label == "smollm2-135m"
    questions = load_questions()[:3]
    assert [a["asked"] for a in r["answers"]] == [q.text for q in questions]
    for q, a in zip(questions, r["answers"]):
        assert words(a["reply"]) and a["right"] == is_right(a["reply"], q.answers, q.reject)
    assert r["summary"]["right"] == sum(a["right"] for a in r["answers"])
    assert sum(n for _, n in r["summary"]["by_kind"].values()) == 3
