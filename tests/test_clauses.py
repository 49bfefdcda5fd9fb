"""ClauseSplitter: where streamed reply text is cut for the TTS (pure policy)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from omniduplex.pipeline.text.clauses import MARKDOWN, MAX_RUN_CHARS, ClauseSplitter, clean, count_words


def split(text: str, deltas: list[int] | None = None, **kw) -> list[str]:
    """Clauses of ``text`` pushed in pieces of the given sizes (default: one character at a time)."""
    s, out, at = ClauseSplitter(**kw), [], 0
    for n in deltas or [1] * len(text):
        out += s.push(text[at : at + n])
        at += n
    out += s.push(text[at:])
    return out + s.flush()


def test_sentences_and_clauses():
    text = "Sure! The oven must be hot, at least 180 degrees; preheat it first. Then: mix the dough well."
    assert split(text) == [
        "Sure!",
        "The oven must be hot,",
        "at least 180 degrees;",
        "preheat it first.",
        "Then: mix the dough well.",  # "Then:" alone is under min_words: merged with what follows
    ]


def test_first_clause_is_cut_early_at_a_word_boundary():
    out = split("I would be very happy to help you plan the whole trip to Paris next week.")
    assert out[0] == "I would be very happy to"
    assert count_words(out[0]) == 6
    assert out[1:] == ["help you plan the whole trip to Paris next week."]


def test_first_clause_waits_for_the_end_of_its_sixth_word():
    s = ClauseSplitter()
    assert s.push("one two three four five si") == []
    assert s.push("x") == []  # "six" could still grow
    assert s.push(" seven") == ["one two three four five six"]
    assert s.flush() == ["seven"]


def test_no_cut_inside_numbers_or_abbreviations():
    text = "Ok. It costs 3.5 euros or 1,000 yen at 10:30 a.m. today, e.g. at Mr. Smith's shop in the U.S. now"
    out = split(text)
    assert out == [
        "Ok.",
        "It costs 3.5 euros or 1,000 yen at 10:30 a.m. today,",
        "e.g. at Mr. Smith's shop in the U.S. now",
    ]


def test_short_later_clauses_are_merged_with_the_next():
    out = split("Hello there. Yes, no, maybe so, we will see about that.")
    assert out == ["Hello there.", "Yes, no, maybe so,", "we will see about that."]
    assert all(count_words(c) >= 3 for c in out[1:])


def test_ellipsis_dash_quotes_and_newlines():
    out = split('Well… I think so—maybe not. "Really?" she asked.\nNext line here\nand one more')
    # "maybe not." and "she asked." are under min_words: each is merged with what follows
    assert out == [
        "Well…",
        "I think so—",
        'maybe not. "Really?"',
        "she asked. Next line here",
        "and one more",
    ]


def test_markdown_and_emoji_are_not_spoken():
    text = "## Recipe\n\n1. **Preheat** the oven 🔥\n2. Mix `flour` and eggs.\n\n* * *\n\n🙂 Enjoy it! 👍🏽"
    out = split(text)
    assert out == ["Recipe", "1. Preheat the oven", "2. Mix flour and eggs.", "Enjoy it!"]
    for c in out:
        assert not any(ch in MARKDOWN for ch in c) and c == c.strip()


def test_nothing_to_say():
    assert split("") == []
    assert split("  \n\n  ") == []
    assert split("** 🙂 **") == []


def test_flush_returns_an_unfinished_clause():
    s = ClauseSplitter()
    assert s.push("Hi") == []
    assert s.flush() == ["Hi"]
    assert s.flush() == []


def test_long_run_without_punctuation_is_cut():
    words = " ".join(f"w{i}" for i in range(100))
    out = split("Okay. " + words, max_words=40)
    assert out[0] == "Okay."
    assert [count_words(c) for c in out[1:]] == [40, 40, 20]


def test_clean():
    assert clean("  **bold**  and\n_it_ 🎉 ") == "bold and it"
    assert clean("25°C, 3 × 4") == "25°C, 3 × 4"  # degree and multiplication signs are spoken


# Property: for any text and any split into deltas, the clauses concatenated are the input without
# whitespace, markup and emoji, and the clauses do not depend on how the text was split.
ALPHABET = st.sampled_from(
    list("abcdefgh XYZ 0123456789 .,;:!?…—-'\"()\n\t") + list(MARKDOWN) + ["🙂", "👍🏽", "\ufe0f", "é"]
)
WORDS = st.sampled_from(["e.g.", "Mr.", "3.5", "1,000", "10:30", "U.S.", "**", "## ", "\n\n", "1. ", " "])
TEXT = st.lists(st.one_of(ALPHABET, WORDS), max_size=80).map("".join)
DROPPED = set(MARKDOWN) | {"🙂", "👍", "🏽", "\ufe0f"}


def _norm(s: str) -> str:
    return "".join(c for c in s if not c.isspace() and c not in DROPPED)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.lists(st.integers(0, 7), max_size=60))
def test_property_clauses_partition_the_text(text, deltas):
    whole = split(text, [len(text)])
    pieces = split(text, deltas)
    assert _norm("".join(pieces)) == _norm(text)
    assert pieces == whole
    for c in pieces:
        assert c and c == c.strip() and not any(ch in DROPPED for ch in c)


def test_an_endless_word_does_not_hold_the_voice_back():
    s = ClauseSplitter(first_max_words=4)
    number = "7," + "981," * 12
    out = []
    for ch in "There are " + number:  # token by token, as a 135M model may write it
        out += s.push(ch)
    assert out[0] == "There are"  # spoken before the run ends
    assert all(len(c) <= MAX_RUN_CHARS for c in out[1:]) and len(out) >= 2
    assert "".join(out[1:]) + s.flush()[0] == number.strip()


def test_an_endless_word_is_cut_the_same_however_it_arrives():
    text = "aaaaaae.g.e.g.e.g.1,0001,0001,000 and more words follow here, then the end."
    assert len(text.split()[0]) > MAX_RUN_CHARS
    assert split(text, [len(text)]) == split(text, []) == split(text, [1] * len(text))
