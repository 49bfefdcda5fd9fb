"""Replies for the ear (pure policy): markdown stripped, streamed the same as whole, and a reply that ends at
its last complete clause when its token budget runs out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omniduplex.pipeline.text.clauses import clause_ends
from omniduplex.pipeline.text.spoken import (
    SPOKEN_SYSTEM_PROMPT,
    EchoFilter,
    MarkdownStripper,
    SpokenReply,
    strip_markdown,
)

# README command 1's answer as SmolLM2 wrote it before this policy: a numbered list cut at "3. Once"
GREEN_TEA = (
    "To make a cup of green tea, follow these steps:\n\n1. **Boil water**: Start by boiling water.\n"
    "2. Add a few drops of black tea to the water.\n3. Once"
)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("## Steps\n1. **Boil** the water.", "Steps\nBoil the water."),
        ("- Add tea.\n* Stir.\n+ Wait.\n• Sip.", "Add tea.\nStir.\nWait.\nSip."),
        ("  2) Steep it.\n10. Done", "Steep it.\nDone"),
        ("> - quoted item", "quoted item"),
        ("Use `snake_case` and __bold__ or _it_ here.", "Use snake_case and bold or it here."),
        ("It is -5 degrees, 3.5 km, ~~old~~ new.", "It is -5 degrees, 3.5 km, old new."),
        ("In 2026 we sold 15 cars. #1 seller.", "In 2026 we sold 15 cars. #1 seller."),
        ("1.5 liters is enough", "1.5 liters is enough"),
        ("Boil it up. 2. Pour it: 3) Sip.", "Boil it up. Pour it: Sip."),
        ("I have 2. Costs 3.5 now. 10 cats.", "I have 2. Costs 3.5 now. 10 cats."),
        ("###\n-\n", "\n\n"),
    ],
)
def test_strip_markdown(text, said):
    assert strip_markdown(text) == said


@given(
    st.text(alphabet=st.sampled_from(list("ab _*#-+>.)1 2\n`~•"))), st.lists(st.integers(0, 40), max_size=8)
)
def test_streamed_stripping_equals_whole(text, cuts):
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    md = MarkdownStripper()
    assert "".join(md.push(p) for p in pieces) + md.flush() == strip_markdown(text)


def test_clause_ends():
    assert clause_ends("Boil the water") == 0
    assert clause_ends("Boil the water.") == 0 and clause_ends("Boil the water.", final=True) == 15
    assert clause_ends("Boil it. Then add tea, and") == len("Boil it. Then add tea,")
    assert clause_ends("It costs 3.5") == 0 and clause_ends("Ask Dr. Smith") == 0


def test_a_reply_cut_by_its_budget_ends_at_its_last_clause():
    reply = SpokenReply()
    said = "".join(reply.push(c) for c in GREEN_TEA) + reply.finish("length")
    assert said == (
        "To make a cup of green tea, follow these steps:\n\nBoil water: Start by boiling water.\n"
        "Add a few drops of black tea to the water.\n"
    )
    assert reply.unspoken == "Once"


def test_a_finished_reply_is_said_whole_and_the_first_clause_streams():
    reply = SpokenReply()
    out = [reply.push(w) for w in ["To ", "make ", "tea", ", boil ", "water ", "and ", "steep ", "it"]]
    assert out[:4] == [
        "To ",
        "make ",
        "",
        "tea,",
    ]  # the first clause streams word by word (the word being written may still become a number's unit)
    assert out[4:] == ["", "", "", ""]  # then text waits for its clause to end
    assert reply.finish("stop") == " boil water and steep it" and reply.unspoken == ""
    for reason in ("length", "stop"):  # a mark at the very end completes the clause
        r = SpokenReply()
        assert r.push("Hi. Boil it.") + r.finish(reason) == "Hi. Boil it."


def test_text_without_markdown_passes_through_when_not_spoken():
    reply = SpokenReply(strip=False)
    assert reply.push("**Bold** 1. x, y") + reply.finish("stop") == "**Bold** 1. x, y"


def test_the_default_prompt_asks_for_speech():
    assert (
        "lists" in SPOKEN_SYSTEM_PROMPT
        and "markdown" in SPOKEN_SYSTEM_PROMPT
        and "short" in SPOKEN_SYSTEM_PROMPT
    )


ECHOED = (
    'Sure. <tool_response>\n{"city": "Paris"}\n</tool_response> It is 18 degrees. '
    "<tool_error>timeout</tool_error> A <b> tag and 3 < 4 stay.</tool_response>"
)


def test_echo_filter_drops_copied_tool_result_tags_on_any_split():
    """Every two-way and several three-way splits of a reply that copies tool results give the same text:
    the tags gone, what they enclose kept (often the only words of a small model's answer)."""
    want = 'Sure. \n{"city": "Paris"}\n It is 18 degrees. timeout A <b> tag and 3 < 4 stay.'
    for i in range(len(ECHOED) + 1):
        for j in sorted({i, (i + len(ECHOED)) // 2, len(ECHOED)}):
            f = EchoFilter()
            got = f.push(ECHOED[:i]) + f.push(ECHOED[i:j]) + f.push(ECHOED[j:]) + f.flush()
            assert got == want, (i, j)


def test_a_held_tag_start_is_released_when_it_is_no_tag_and_a_spoken_reply_never_says_a_tag():
    f = EchoFilter()
    assert f.push("The order <tool_resp") == "The order "
    assert f.push("ite") + f.flush() == "<tool_respite"
    reply = SpokenReply()
    said = "".join(reply.push(d) for d in ["It <tool_", "response>ships</tool_", "response> today."])
    assert said + reply.finish("stop") == "It ships today."
