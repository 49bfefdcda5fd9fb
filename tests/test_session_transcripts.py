"""History holds what was said: the ASR transcript replaces the user placeholder, an empty transcript removes
the turn, and an interrupted reply keeps the words of the audio chunks actually played (text↔audio alignment
from the TTS stage) rather than a character share of the whole reply."""

from __future__ import annotations

import numpy as np
import pytest
from session_harness import LOUD, QUIET, Harness, run, tone

from omniduplex.app.core.events import ReplyEnded, UserTranscriptEvent, UserTurnCommitted
from omniduplex.app.core.history import History, truncate_aligned, truncate_reply
from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyTextDelta, UserTranscript
from omniduplex.app.core.vad import TurnConfig


@pytest.mark.parametrize(
    "played, kept",
    [
        (0, ""),
        (30, ""),  # the first word was not finished
        (700, "Paris is the capital"),  # inside the first clause: its played share, to a word end
        (1000, "Paris is the capital of France."),
        (1500, "Paris is the capital of France. It lies on"),  # half of "It lies on the Seine."
        (3000, "Paris is the capital of France. It lies on the Seine. Ten million live there."),
        (10_000, "Paris is the capital of France. It lies on the Seine. Ten million live there."),
    ],
)
def test_truncate_aligned_keeps_whole_played_chunks_and_a_share_of_the_current_one(played, kept):
    chunks = [
        (1000, "Paris is the capital of France. "),
        (2000, "It lies on the Seine. "),
        (3000, "Ten million live there."),
    ]
    text = "".join(said for _, said in chunks)
    assert truncate_aligned(chunks, played, text) == kept


def test_truncate_aligned_is_confined_to_the_playing_chunk():
    # a short first clause and a long second one: the proportional rule over the whole reply would keep far
    # more than was heard; the alignment keeps the first clause and nothing of the second
    chunks = [(1000, "Yes."), (1100, "And here is a long explanation of everything that follows it.")]
    text = "Yes. And here is a long explanation of everything that follows it."
    assert truncate_aligned(chunks, 1001, text) == "Yes."
    assert len(truncate_reply(text, 1001, 1100)) > 40


def test_history_entry_can_be_replaced_and_removed():
    h = History(4)
    e = h.add("user", "[spoken turn, 1.0 s]")
    e2 = h.set_text(e.key, "what time is it")
    assert h.snapshot() == [["user", "what time is it"]] and e2.key == e.key
    assert e.text == "[spoken turn, 1.0 s]"  # immutable: the old entry is unchanged
    assert h.remove(e) and not h.remove(e)  # by key: the replaced entry names the same turn
    assert h.snapshot() == [] and h.add("user", "") is None


def _turn(h: Harness):
    (c,) = h.of(UserTurnCommitted)[-1:]
    return c


def test_transcript_replaces_the_placeholder_and_reaches_the_next_turn():
    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        c = _turn(h)
        h.responder.feed(
            c.turn_id,
            UserTranscript("How many days are in a week?", [["How", 0.1, 0.2]]),
            ReplyTextDelta("A week has seven days."),
            ReplyAudioChunk(tone(0.5), "A week has seven days."),
            ReplyDone(),
        )
        await h.frames(QUIET, 40)
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        return h, c

    h, c = run(main())
    (t,) = h.of(UserTranscriptEvent)
    assert t.turn_id == c.turn_id and t.text == "How many days are in a week?" and t.words[0][0] == "How"
    _, _, history = h.responder.started[1]
    assert history == [["user", "How many days are in a week?"], ["assistant", "A week has seven days."]]


def test_empty_transcript_removes_the_user_turn_from_history():
    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        c = _turn(h)
        h.responder.feed(c.turn_id, UserTranscript(""), ReplyDone())  # the pipeline built no reply
        await h.frames(QUIET, 10)
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        return h

    h = run(main())
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "completed" and ended.text == "" and ended.played_ms == 0
    _, _, history = h.responder.started[1]
    assert history == []


def test_barge_in_keeps_the_played_chunks_by_alignment():
    async def main():
        h = Harness(TurnConfig(barge_in_ms=200))
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        c = _turn(h)
        clauses = ["Sure thing.", "The first step is to preheat the oven.", "Then mix the flour and eggs."]
        h.responder.feed(c.turn_id, ReplyTextDelta(" ".join(clauses)))
        h.responder.feed(c.turn_id, *(ReplyAudioChunk(tone(d), t) for d, t in zip((0.3, 1.5, 1.5), clauses)))
        await h.frames(QUIET, 30)  # ~580 ms played: all of clause 1, a fifth of clause 2
        await h.frames(LOUD, 10)  # barge-in at 200 ms of speech
        await h.frames(QUIET, 30)
        return h

    h = run(main())
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "interrupted"
    assert ended.kept_text.startswith("Sure thing. The first")
    assert "flour" not in ended.kept_text and "oven" not in ended.kept_text
    assert np.abs(h.out[-1]).max() == 0


def test_typed_turn_and_instructions_reach_the_responder():
    async def main():
        h = Harness()
        h.session.add_user_text("hello, who are you?")
        tid = h.session.respond(instructions="Answer in French.", metadata={"k": 1})
        await h.frames(QUIET, 2)
        return h, tid

    h, tid = run(main())
    turn_id, wav, history = h.responder.started[0][:3]
    assert turn_id == tid and wav.size == 0 and history == []
    opts = h.responder.options[tid]
    assert opts["user_text"] == "hello, who are you?" and opts["instructions"] == "Answer in French."
    assert opts["metadata"] == {"k": 1}


def test_commit_without_response_waits_for_respond():
    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        wav = np.concatenate(h.session._turns.frames).astype(np.float32) / 32768.0
        tid = h.session._conv.commit(wav, 400.0, h.t, respond=False)
        assert h.responder.started == []
        assert h.session.respond() == tid
        return h, tid

    h, tid = run(main())
    turn_id, wav, history = h.responder.started[0][:3]
    assert turn_id == tid and wav.size > 0 and history == []  # its own placeholder is not history
    assert h.responder.options[tid].get("user_text") is None


def test_truncate_keeps_the_words_of_the_played_audio_and_rejects_past_the_end():
    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        c = _turn(h)
        clauses = ["Sure thing.", "The oven goes to two hundred degrees."]
        h.responder.feed(c.turn_id, *(ReplyAudioChunk(tone(d), t) for d, t in zip((0.5, 1.0), clauses)))
        h.responder.feed(c.turn_id, ReplyTextDelta(" ".join(clauses)), ReplyDone())
        await h.frames(QUIET, 90)  # the whole 1.5 s plays: the history has the full reply
        return h, c

    h, c = run(main())
    full = "Sure thing. The oven goes to two hundred degrees."
    assert list(h.session.history.entries[-1]) == ["assistant", full]
    # the client says it played only 600 ms (its own buffer was cut): keep clause 1 and a word of clause 2
    assert h.session.truncate(c.turn_id, 600) == "Sure thing. The"
    assert list(h.session.history.entries[-1]) == ["assistant", "Sure thing. The"]
    with pytest.raises(ValueError, match="past the reply's audio"):
        h.session.truncate(c.turn_id, 5000)
    assert h.session.truncate("unknown-turn", 10) is None
    spoken = [e.text for e in h.events if e.type == "reply_spoken"]
    assert spoken == ["Sure thing.", "The oven goes to two hundred degrees."]  # in step with playback
