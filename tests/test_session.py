"""Session turn-taking without a browser: endpointing, reply playout, barge-in with truncation, history.

A scripted responder stands in for the pipeline and a loud/quiet VAD for webrtcvad (webrtcvad itself is
covered in test_vad.py, and end to end in test_session_webrtcvad below). A fake clock advances 20 ms
per frame; the test pulls one 20 ms output frame per input frame, as the WebRTC transport does.
"""

from __future__ import annotations

import numpy as np
import pytest
from session_harness import (
    LOUD,
    OUT_RATE,
    QUIET,
    Harness,
    LoudVad,
    ScriptedResponder,
    run,
    tone,
)

from omniduplex.app.core.events import (
    BargeIn,
    ReplyAudioStarted,
    ReplyEnded,
    ReplyText,
    SessionClosed,
    UserSpeechStarted,
    UserTurnCommitted,
)
from omniduplex.app.core.history import History, truncate_reply
from omniduplex.app.core.playout import PlayoutBuffer
from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyFailed, ReplyTextDelta
from omniduplex.app.core.session import Session
from omniduplex.app.core.vad import TurnConfig


def test_endpointing_commits_after_configured_silence():
    async def main():
        h = Harness(TurnConfig(endpoint_ms=300))
        await h.frames(QUIET, 10)
        await h.frames(LOUD, 25)  # 500 ms of speech
        assert len(h.of(UserSpeechStarted)) == 1
        await h.frames(QUIET, 14)  # 280 ms: not yet
        assert h.of(UserTurnCommitted) == [] and h.responder.started == []
        await h.frames(QUIET, 1)  # 300 ms of silence
        return h

    h = run(main())
    (c,) = h.of(UserTurnCommitted)
    assert c.turn_id == "s-1" and c.speech_ms == 500
    turn_id, wav, history = h.responder.started[0]
    assert turn_id == "s-1" and history == [] and wav.dtype == np.float32
    # 200 ms pre-roll before the frame that opened the segment (8 quiet + 2 onset frames), the 23
    # remaining speech frames, 100 ms of the trailing silence
    assert wav.size == 320 * (10 + 23 + 5)
    assert np.abs(wav[: 320 * 8]).max() == 0 and np.abs(wav[320 * 8 : 320 * 33]).min() > 0.2
    assert np.abs(wav[320 * 33 :]).max() == 0


def test_noise_shorter_than_min_turn_is_not_committed():
    async def main():
        h = Harness(TurnConfig(min_turn_ms=200))
        await h.frames(LOUD, 5)  # 100 ms
        await h.frames(QUIET, 40)
        return h

    h = run(main())
    assert len(h.of(UserSpeechStarted)) == 1 and h.of(UserTurnCommitted) == []


def test_reply_plays_completely_and_history_carries_to_the_next_turn():
    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        (c,) = h.of(UserTurnCommitted)
        h.responder.feed(c.turn_id, ReplyTextDelta("hello "), ReplyAudioChunk(tone(0.5)))
        h.responder.feed(c.turn_id, ReplyTextDelta("there"), ReplyAudioChunk(tone(0.5)), ReplyDone())
        await h.frames(QUIET, 60)  # 1.2 s: the whole reply plays
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        return h, c

    h, c = run(main())
    assert "".join(e.text for e in h.of(ReplyText)) == "hello there"
    (started,) = h.of(ReplyAudioStarted)
    # speech ended on the last loud frame, the commit came 500 ms later, the reply task filled the
    # playout buffer during the next frame and its audio was pulled on the one after
    assert started.latency_ms == pytest.approx(540, abs=1e-6)
    assert started.commit_to_audio_ms == pytest.approx(40, abs=1e-6)
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "completed" and ended.kept_text == "hello there"
    assert ended.played_ms == pytest.approx(1000, abs=2) and ended.generated_ms == ended.played_ms
    audio = np.concatenate(h.out)
    voiced = np.flatnonzero(np.abs(audio) > 0)
    assert voiced.size > 0.95 * OUT_RATE and np.abs(audio).max() > 0.25 * 32767
    _, _, history = h.responder.started[1]
    assert history == [["user", "[spoken turn, 0.4 s]"], ["assistant", "hello there"]]


def test_barge_in_flushes_playout_cancels_and_truncates_history():
    async def main():
        h = Harness(TurnConfig(barge_in_ms=200))
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        (c,) = h.of(UserTurnCommitted)
        text = "one two three four five six seven eight nine ten"
        h.responder.feed(c.turn_id, ReplyTextDelta(text), ReplyAudioChunk(tone(2.0)))
        await h.frames(QUIET, 25)  # 480 ms of the 2 s reply played (it starts on the 2nd pull)
        n_before = len(h.out)
        await h.frames(LOUD, 9)  # 180 ms of speech: below the barge-in threshold, still playing
        assert h.of(BargeIn) == []
        await h.frames(LOUD, 1)  # 200 ms → barge-in on this frame; this pull is already silent
        return h, c, text, n_before

    h, c, text, n_before = run(main())
    (b,) = h.of(BargeIn)
    assert b.turn_id == c.turn_id and b.speech_ms == 200
    assert h.responder.cancelled == [c.turn_id]
    assert all(np.abs(f).max() > 0 for f in h.out[n_before + 1 : n_before + 9])
    assert np.abs(h.out[-1]).max() == 0
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "interrupted" and ended.stop_ms == pytest.approx(0.0, abs=1e-6)
    # 24 + 9 frames played; the streaming resampler still holds ~30 ms of the generated 2 s
    assert ended.played_ms == pytest.approx(660) and ended.generated_ms == pytest.approx(2000, abs=40)
    assert ended.kept_text == truncate_reply(text, ended.played_ms, ended.generated_ms) == "one two three"


STORY = "A brave cat... (laughs)\n\nIn the past, there lived a **brave** cat."
STORY_CLAUSES = [("A brave cat... (laughs)", 0.5), ("In the past, there lived a brave cat.", 1.0)]


@pytest.mark.parametrize(
    "how, kept",
    [
        # barge-in ~0.8 s into the reply: clause 1 and a share of clause 2, cut back to a word end
        ("barge_in", "A brave cat... (laughs)\n\nIn the"),
        # the client played 1.5 s (all of it): everything up to the last spoken word, markup kept as written
        ("truncate_all", "A brave cat... (laughs)\n\nIn the past, there lived a **brave** cat."),
        ("truncate_clause", "A brave cat... (laughs)"),
    ],
)
def test_truncation_keeps_exactly_a_prefix_of_the_generated_text(how, kept):
    """The TTS chunks carry their clauses cleaned (whitespace collapsed, markup dropped); what the history
    keeps is still the generated text's own prefix, blank line and markup included (e2e cascade failure:
    the history kept 'A brave cat... (laughs) In the' for a reply '...(laughs)\n\nIn the past...')."""

    async def main():
        h = Harness(TurnConfig(barge_in_ms=200))
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        (c,) = h.of(UserTurnCommitted)
        h.responder.feed(c.turn_id, ReplyTextDelta(STORY[:30]), ReplyTextDelta(STORY[30:]))
        h.responder.feed(c.turn_id, *(ReplyAudioChunk(tone(d), said) for said, d in STORY_CLAUSES))
        if how == "barge_in":
            await h.frames(QUIET, 28)
            await h.frames(LOUD, 10)
            return h, c, None
        h.responder.feed(c.turn_id, ReplyDone())
        await h.frames(QUIET, 90)
        return h, c, h.session.truncate(c.turn_id, 1500 if how == "truncate_all" else 500)

    h, c, returned = run(main())
    entry = h.session.entry(c.turn_id, "assistant")
    assert entry.text == kept and STORY.startswith(entry.text)
    if how == "barge_in":
        (ended,) = h.of(ReplyEnded)
        assert ended.text == STORY and ended.kept_text == kept
    else:
        assert returned == kept and h.session.reply_record(c.turn_id).kept == kept


def test_after_barge_in_the_next_turn_carries_the_truncated_reply():
    async def main():
        h = Harness(TurnConfig(barge_in_ms=200))
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        (c,) = h.of(UserTurnCommitted)
        h.responder.feed(c.turn_id, ReplyTextDelta("alpha beta gamma delta"), ReplyAudioChunk(tone(2.0)))
        await h.frames(QUIET, 40)
        await h.frames(LOUD, 30)  # barge-in, then the speech goes on and ends
        late = ReplyAudioChunk(tone(1.0))  # the pipeline's late output for the cancelled turn is dropped
        h.responder.queues[c.turn_id].put_nowait(late)
        await h.frames(QUIET, 30)
        return h, c

    h, c = run(main())
    assert [e.turn_id for e in h.of(UserTurnCommitted)] == ["s-1", "s-2"]
    ended = h.of(ReplyEnded)[0]
    _, _, history = h.responder.started[1]
    assert history == [["user", "[spoken turn, 0.4 s]"], ["assistant", ended.kept_text]]
    assert 0 < len(ended.kept_text) < len("alpha beta gamma delta")
    after = h.out[-50:]  # nothing of the cancelled reply plays after the barge-in
    assert all(np.abs(f).max() == 0 for f in after)


def test_short_speech_over_the_reply_is_ignored():
    async def main():
        h = Harness(TurnConfig(barge_in_ms=300))
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        (c,) = h.of(UserTurnCommitted)
        h.responder.feed(c.turn_id, ReplyTextDelta("hi"), ReplyAudioChunk(tone(2.0)), ReplyDone())
        await h.frames(QUIET, 10)
        await h.frames(LOUD, 10)  # 200 ms cough
        await h.frames(QUIET, 100)
        return h

    h = run(main())
    assert h.of(BargeIn) == [] and len(h.of(UserTurnCommitted)) == 1
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "completed" and ended.played_ms == pytest.approx(2000, abs=2)


def test_speech_while_the_reply_is_pending_cancels_it_with_nothing_kept():
    async def main():
        h = Harness(TurnConfig(barge_in_ms=200))
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        (c,) = h.of(UserTurnCommitted)
        h.responder.feed(c.turn_id, ReplyTextDelta("thinking out loud"))
        await h.frames(LOUD, 12)
        return h, c

    h, c = run(main())
    assert h.responder.cancelled == [c.turn_id]
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "interrupted" and ended.played_ms == 0 and ended.kept_text == ""
    assert h.session.history.snapshot() == [["user", "[spoken turn, 0.4 s]"]]


def test_pipeline_error_ends_the_reply_and_the_session_goes_on():
    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        h.responder.feed("s-1", ReplyAudioChunk(tone(1.0)), ReplyFailed("talker failed"))
        await h.frames(QUIET, 5)
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        return h

    h = run(main())
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "error" and ended.error == "talker failed"
    assert all(np.abs(f).max() == 0 for f in h.out[-30:])
    assert [e.turn_id for e in h.of(UserTurnCommitted)] == ["s-1", "s-2"]


def test_a_failed_reply_says_the_apology_and_still_ends_as_an_error():
    apology = "Sorry, that failed."

    async def main(apology_fails: bool):
        h = Harness()
        h.session.cfg.failure_apology = apology
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        h.responder.feed("s-1", ReplyTextDelta("never heard"), ReplyAudioChunk(tone(1.0)))
        h.responder.feed("s-1", ReplyFailed("llm failed: boom", stage="llm"))
        await h.frames(QUIET, 2)
        said = [(rid, o["say"]) for rid, o in h.responder.options.items() if "say" in o]
        if apology_fails:
            h.responder.feed("s-1.1", ReplyFailed("tts failed too", stage="tts"))
        else:
            h.responder.feed("s-1.1", ReplyTextDelta(apology), ReplyAudioChunk(tone(0.5)), ReplyDone({}))
        await h.frames(QUIET, 60)
        return h, said

    h, said = run(main(apology_fails=False))
    assert said == [("s-1.1", apology + " ")]  # said as written, through a ``say`` request
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "error" and ended.error == "llm failed: boom" and ended.text == apology
    assert ended.played_ms == pytest.approx(500, abs=40)  # the apology played, none of the failed reply
    assert h.session.history.snapshot()[-1] == ["assistant", apology]

    h, _ = run(main(apology_fails=True))  # nothing to say it with: the reply ends, the session goes on
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "error" and ended.error == "tts failed too" and not h.session.busy


def test_close_mid_reply_cancels_and_drains_the_turn():
    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        h.responder.feed("s-1", ReplyTextDelta("a b c d"), ReplyAudioChunk(tone(2.0)))
        await h.frames(QUIET, 25)
        await h.session.close("client gone")
        await h.frames(LOUD, 50)  # ignored after close
        return h

    h = run(main())
    assert h.responder.cancelled == ["s-1"] and "s-1" in h.responder.finished
    assert h.session.tasks == set()
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "closed" and 0 < ended.played_ms < ended.generated_ms
    assert isinstance(h.events[-1], SessionClosed) and h.events[-1].reason == "client gone"
    assert len(h.of(UserTurnCommitted)) == 1


def test_events_serialize_with_their_type():
    b = BargeIn("s", "s-1", speech_ms=300.0, played_ms=1234.5)
    assert b.to_dict() == {
        "type": "barge_in",
        "session_id": "s",
        "turn_id": "s-1",
        "speech_ms": 300.0,
        "played_ms": 1234.5,
    }
    assert '"type": "barge_in"' in b.to_json()


@pytest.mark.parametrize(
    ("text", "played", "generated", "kept"),
    [
        ("hello there world", 0, 1000, ""),
        ("hello there world", 1000, 1000, "hello there world"),
        ("hello there world", 1500, 1000, "hello there world"),
        ("hello there world", 500, 1000, "hello"),  # 8.5 → 8 chars "hello th" → back to a word end
        ("hello there world", 700, 1000, "hello there"),  # 12 chars end on the space
        ("abcdefghij", 500, 1000, "abcde"),  # one word: raw prefix
        ("", 500, 1000, ""),
    ],
)
def test_truncate_reply_keeps_characters_in_proportion_to_played_audio(text, played, generated, kept):
    assert truncate_reply(text, played, generated) == kept


def test_history_is_bounded_trimmed_by_halves_and_snapshots_are_copies():
    h = History(max_entries=4)
    firsts = []
    for i in range(9):
        h.add("user", f"u{i}")
        assert len(h.entries) <= 4
        firsts.append(h.entries[0].text)
    h.add("assistant", "")
    # trimmed to the newest 2 when a 5th entry comes, so the prompt's first entry changes every 3rd turn
    assert firsts == ["u0", "u0", "u0", "u0", "u3", "u3", "u3", "u6", "u6"]
    snap = h.snapshot()
    assert snap == [["user", "u6"], ["user", "u7"], ["user", "u8"]]
    snap[0][1] = "x"
    assert list(h.entries[0]) == ["user", "u6"]


def test_playout_buffer_resamples_reads_exact_frames_and_flushes():
    p = PlayoutBuffer(24000, 48000)
    queued = p.push(tone(0.1)) + p.push(np.zeros(0, np.float32), last=True)
    assert queued == 4800 and p.queued_ms == pytest.approx(100)
    frame, filled = p.read(960)
    assert frame.dtype == np.int16 and frame.shape == (960,) and filled == 960
    assert p.flush() == 3840 and p.queued == 0
    frame, filled = p.read(960)
    assert filled == 0 and not frame.any()


def test_sessions_sharing_a_responder_are_isolated():
    async def main():
        a, b = Harness(TurnConfig(barge_in_ms=200)), Harness(TurnConfig(barge_in_ms=200))
        shared = ScriptedResponder()
        for h, name in ((a, "a"), (b, "b")):
            h.responder = shared
            h.session = Session(name, shared, h.events.append, h.session.cfg, LoudVad(), lambda h=h: h.t)
        for h in (a, b):
            await h.frames(LOUD, 20)
            await h.frames(QUIET, 25)
        shared.feed("a-1", ReplyTextDelta("for a"), ReplyAudioChunk(tone(2.0)))
        shared.feed("b-1", ReplyTextDelta("for b"), ReplyAudioChunk(tone(2.0)))
        await a.frames(QUIET, 10)
        await b.frames(QUIET, 10)
        await a.frames(LOUD, 12)  # a interrupts its reply; b keeps playing
        await b.frames(QUIET, 10)
        return a, b, shared

    a, b, shared = run(main())
    assert [s[0] for s in shared.started] == ["a-1", "b-1"] and shared.cancelled == ["a-1"]
    assert [e.text for e in a.of(ReplyText)] == ["for a"] and [e.text for e in b.of(ReplyText)] == ["for b"]
    assert len(a.of(BargeIn)) == 1 and b.of(BargeIn) == [] and b.of(ReplyEnded) == []
    assert all(np.abs(f).max() > 0 for f in b.out[-10:])
    assert b.session.history.snapshot() == [["user", "[spoken turn, 0.4 s]"]]


@pytest.mark.parametrize("cancel_first", [False, True])
def test_truncate_applies_to_the_reply_in_flight_before_it_ends(cancel_first):
    """A client's truncate for the reply still playing (or stopped by ``cancel_reply`` but not yet ended:
    its stop frame not pulled) stops it and keeps the words of the played audio, before the reply ends."""

    async def main():
        h = Harness()
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 25)
        (c,) = h.of(UserTurnCommitted)
        chunks = [ReplyAudioChunk(tone(d), said) for said, d in STORY_CLAUSES]
        h.responder.feed(c.turn_id, ReplyTextDelta(STORY), *chunks)
        await h.frames(QUIET, 40)  # ~0.78 s played
        if cancel_first:
            assert h.session.cancel_reply()
        kept = h.session.truncate(c.turn_id, 500)
        ended_before = h.of(ReplyEnded)
        await h.frames(QUIET, 2)
        return h, c, kept, ended_before

    h, c, kept, ended_before = run(main())
    assert kept == "A brave cat... (laughs)" and ended_before == []
    assert h.responder.cancelled == [c.turn_id] and len(h.of(BargeIn)) == 1
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "interrupted" and ended.kept_text == kept and ended.played_ms == 500
    assert h.session.history.snapshot()[-1] == ["assistant", kept]
