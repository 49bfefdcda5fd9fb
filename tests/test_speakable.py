"""The speakable-text stage (pipeline/text/speakable.py, verbalize.py) on the path a reply takes to the TTS
(ReplyStream → SpokenReply): adversarial model output, split at random token boundaries, comes out speakable;
numbers, dates, times and currencies are said in words; a few sentences, never cut mid-sentence."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from omniduplex.pipeline.text.reply_text import ReplyStream
from omniduplex.pipeline.text.speakable import BlockFilter, Verbalizer, is_speakable, json_words
from omniduplex.pipeline.text.spoken import SENTENCES, SENTENCES_ASKED, sentence_budget, sentence_ends
from omniduplex.pipeline.text.verbalize import verbalize

WORDS = st.sampled_from(["the", "tea", "order", "Friday", "water", "is", "ready", "café", "naïve", "x"])
SENTENCE = st.lists(WORDS, min_size=1, max_size=8).map(lambda w: " ".join(w).capitalize() + ".")
NUMBER = st.one_of(
    st.integers(-10**25, 10**25).map(str),
    st.integers(0, 10**9).map(lambda n: f"{n:,}"),
    st.floats(0, 1e6, allow_nan=False).map(lambda x: f"{x:.3f}"),
    st.sampled_from(["$12.50", "€5 million", "£3", "¥500", "50%", "21°C", "-4°F", "5 km", "3kg", "10:30 am",
                     "9:05", "3pm", "2026-11-27", "11/27/2026", "November 27, 2026", "3rd", "1990s", "5-10",
                     "in 1999", "x²", "H2O", "7,981,981,981,981,981,981"]),
)
URL = st.sampled_from(["https://www.example.com/a/b?c=1", "http://shop.example.org", "www.tea.io/x",
                       "[the menu](https://menu.example.com)", "bob@example.com"])
EMOJI = st.sampled_from(["😀", "👍🏽", "🍵", "❤️", "🇫🇷", "★", "→", "✅"])
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text("abc xyz_-:,.{}[]\"", max_size=12),
    lambda kids: st.lists(kids, max_size=3)
    | st.dictionaries(st.sampled_from(["status", "temp_c", "a"]), kids, max_size=3),
    max_leaves=8,
)
JSON = st.dictionaries(st.sampled_from(["status", "arrives", "order_id", "temp_c"]), JSON_VALUE, min_size=1,
                       max_size=4).map(json.dumps)


@st.composite
def markdown_list(draw):
    items = draw(st.lists(SENTENCE, min_size=1, max_size=4))
    style = draw(st.sampled_from(["{n}. ", "{n}) ", "- ", "* ", "• ", "  {n}. **", "## "]))
    sep = draw(st.sampled_from(["\n", " ", ", "]))
    return sep.join(style.format(n=i + 1) + it for i, it in enumerate(items))


@st.composite
def table(draw):
    rows = draw(st.lists(st.lists(st.one_of(WORDS, NUMBER), min_size=2, max_size=3), min_size=1, max_size=3))
    width = len(rows[0])
    lines = ["| " + " | ".join(r[:width] + ["x"] * (width - len(r))) + " |" for r in rows]
    lines.insert(1, "|" + "|".join(["---"] * width) + "|")
    return "\n".join(lines) + "\n"


CODE = st.sampled_from(["```python\nprint({'a': 1})\nfor i in range(3): x[i] = i\n```",
                        "```\n$ curl https://x.io | jq .\n```", "`x = 1`", "```json\n{\"a\": [1, 2]}\n```"])
PIECE = st.one_of(SENTENCE, NUMBER, URL, EMOJI, JSON, markdown_list(), table(), CODE,
                  st.sampled_from(["**bold**", "_it_", "~~gone~~", "# Heading\n", "> quote\n", "---\n",
                                   "***\n", "<tool_response>", " & ", " = ", " + ", "#1", "a|b", "\\", "^",
                                   "<b>"]))
ADVERSARIAL = st.lists(PIECE, min_size=1, max_size=8).map(" ".join)


def speak(text: str, cuts: list[int], max_sentences: int | None = None) -> tuple[list[str], ReplyStream]:
    """``text`` split at ``cuts`` fed to a spoken reply stream as the LLM stage does; the text deltas."""
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    reply = ReplyStream(speech=True, max_sentences=max_sentences)
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        out += [m["text"] for m in reply.push(text[a:b])]
        if reply.stop:
            break
    metas, _ = reply.finish(None)
    return out + [m["text"] for m in metas], reply


@settings(max_examples=300, deadline=None)
@given(ADVERSARIAL, st.lists(st.integers(0, 10**4), max_size=40))
def test_adversarial_llm_output_reaches_tts_speakable(text, cuts):
    deltas, _ = speak(text, cuts)
    said = "".join(deltas)
    assert is_speakable(said), (text, said)
    assert all(is_speakable(d) for d in deltas)
    assert not re.search(r"(?m)^\s*-", said)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["status", "arrives", "city"]),
                       st.sampled_from(["shipped", "Friday", "Paris", "rain"]), min_size=1),
       st.lists(st.integers(0, 200), max_size=20))
def test_json_is_said_as_its_values(obj, cuts):
    said = "".join(speak(f"Result: {json.dumps(obj)} done.", cuts)[0])
    assert "{" not in said and '"' not in said
    for key, value in obj.items():
        assert f"{key} {value}" in said


def test_numbers_dates_times_currencies_units_in_words():
    cases = {
        "It costs $12.50.": "It costs twelve dollars and fifty cents.",
        "Pay £3 now": "Pay three pounds sterling now",
        "Delivery on 2026-11-28.": "Delivery on November twenty-eighth, twenty twenty-six.",
        "At 10:30 am or 9:05": "At ten thirty a.m. or nine oh five",
        "It is 21°C": "It is twenty-one degrees Celsius",
        "Drive 5 km": "Drive five kilometers",
        "Up 50%": "Up fifty percent",
        "The 3rd time since 1999": "The third time since nineteen ninety-nine",
        "Open 9-17": "Open nine to seventeen",
        "See https://www.shop.example.com/menu?a=1 now": "See shop dot example dot com now",
        "Call 5551234567890123": "Call five five five one two three four five six seven eight nine zero "
        "one two three",
    }
    for written, said in cases.items():
        assert verbalize(written) == said
        assert is_speakable(said)


def test_list_numbers_are_never_spoken():
    # README command 1 as heard on main: the numbers of a list run into one line were read out
    reply = ("Boil water until it's just right, 2. Add a pinch of salt to the boiling water for flavor, 3. "
             "Pour the hot liquid into a cup or a mug, 4. Enjoy your morning green tea!")
    said = "".join(speak(reply, list(range(0, len(reply), 3)))[0])
    assert not re.search(r"\b(two|three|four)\b", said), said
    assert said.startswith("Boil water") and said.endswith("green tea!")


def test_tables_code_and_rules():
    text = "Prices:\n| Item | Price |\n|:--|--:|\n| Tea | $3 |\n---\n```py\nx = {1: 2}\n```\nThanks."
    said = "".join(speak(text, list(range(0, len(text), 2)))[0])
    assert " ".join(said.split()) == "Prices: Item, Price. Tea, three dollars. Thanks."


def test_a_few_sentences_unless_asked_for_more_never_cut_mid_sentence():
    text = "One fact here. Two facts there! Is that three? Four is too many. Five."
    deltas, reply = speak(text, list(range(0, len(text), 4)), max_sentences=SENTENCES)
    assert "".join(deltas) == "One fact here. Two facts there! Is that three?"
    assert reply.stop == "stop"  # the stage ends the generation: the reply is complete
    assert sentence_budget("What is the capital of France?") == SENTENCES
    assert sentence_budget("Tell me a story about a dragon") == SENTENCES_ASKED
    assert len(sentence_ends("Dr. Who met Amy e.g. today. Then left! ")) == 2


def test_streaming_holds_at_most_the_clause_being_written():
    v = Verbalizer()
    assert v.push("The order shipped and ") == "The order shipped and "
    assert v.push("arrives on November ") == "arrives on "  # its day may follow
    assert v.push("27 at 10:30 ") == "November twenty-seventh at "  # "10:30" may get "am"
    assert v.push("tonight.") == ""  # the word being written
    assert v.flush() == "ten thirty tonight."
    v = Verbalizer()  # a date written word by word is said whole
    words = ["It", "is", "on", "November", "27,", "2026", "at", "noon."]
    said = "".join(v.push(w + " ") for w in words) + v.flush()
    assert said == "It is on November twenty-seventh, twenty twenty-six at noon. "
    b = BlockFilter()
    assert b.push("Fine, ") == "Fine, "
    assert b.push('{"status": "shi') == ""  # a JSON object is held until it closes
    assert b.push('pped"} ok') == " status shipped  ok"
    assert b.push("\n| a ") == "\n"  # a table row is held until its line ends
    assert b.push("| b |\nend") == "a, b.\nend"


def test_json_words():
    said = json_words('{"temp_c": 21, "sunny": true, "tags": ["a", "b"]}')
    assert said == "temp c 21, sunny yes, tags a, b"
    assert json_words("{not json}") == ""


def test_a_reply_out_of_its_token_budget_finishes_the_sentence_it_is_saying():
    reply = ReplyStream(speech=True, text_budget=5, finish_sentence=True, max_sentences=3)
    said = []
    for word in ["One", "two", "three", "four", "five", "six", "seven.", "Eight", "nine", "ten."]:
        said += [m["text"] for m in reply.push(word + " ")]
        if reply.stop:
            break
    metas, reason = reply.finish(None)
    said += [m["text"] for m in metas]
    assert "".join(said) == "One two three four five six seven." and reason == "stop"
    cut = ReplyStream(speech=True, text_budget=5, max_sentences=3)  # no grace: cut at the budget
    for word in ["One", "two,", "three", "four", "five", "six", "seven."]:
        cut.push(word + " ")
    assert cut.stop == "length"
