"""Preemptive generation: the reply to the turn so far starts during the pause that may end it, held back
until the turn ends with the same audio and context, cancelled (and never seen) otherwise.

Driven by test_session's harness: a fake clock, a loud/quiet VAD, a scripted responder; 20 ms per frame.
Default turn config: 500 ms endpointing; preemptive generation at 200 ms of silence (10 frames).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from session_harness import LOUD, QUIET, Harness, run, tone

from omniduplex.app.core.events import (
    ReplyAudioStarted,
    ReplyEnded,
    ReplyStarted,
    ReplyText,
    UserTranscriptEvent,
    UserTurnCommitted,
)
from omniduplex.app.core.replies import ReplyAudioChunk, ReplyDone, ReplyTextDelta, UserTranscript
from omniduplex.app.core.vad import TurnConfig

PREEMPT = 200


def test_reply_starts_in_the_pause_is_held_and_is_adopted_at_the_end_of_turn():
    async def main():
        h = Harness(preemptive_ms=PREEMPT)
        await h.frames(LOUD, 20)  # 400 ms of speech
        await h.frames(QUIET, 9)  # 180 ms of silence: not yet
        assert h.responder.started == []
        await h.frames(QUIET, 1)  # 200 ms: the reply to the turn so far starts
        ((turn_id, wav, history),) = h.responder.started
        assert history == [] and wav.dtype == np.float32
        # the pipeline answers before the turn has ended: nothing of it is seen yet
        h.responder.feed(turn_id, UserTranscript("hello"), ReplyTextDelta("hi "), ReplyAudioChunk(tone(0.2)))
        h.responder.feed(turn_id, ReplyTextDelta("there"), ReplyAudioChunk(tone(0.2)), ReplyDone())
        await h.frames(QUIET, 14)  # 480 ms of silence
        assert h.of(UserTurnCommitted) == [] and h.of(ReplyStarted) == [] and h.of(ReplyText) == []
        assert h.of(UserTranscriptEvent) == [] and not any(np.any(f) for f in h.out)
        await h.frames(QUIET, 1)  # 500 ms: end of turn, the held reply is adopted
        committed = h.of(UserTurnCommitted)
        await h.frames(QUIET, 40)
        return h, turn_id, wav, committed

    h, turn_id, wav, committed = run(main())
    assert [c.turn_id for c in committed] == [turn_id] and len(h.responder.started) == 1
    assert h.responder.cancelled == []
    # the turn's audio is what it was at the pause: its speech and 100 ms of the silence after it
    assert wav.size == (20 + 5) * 320
    assert [e.text for e in h.of(UserTranscriptEvent)] == ["hello"]
    assert "".join(e.text for e in h.of(ReplyText)) == "hi there"
    (started,) = h.of(ReplyAudioStarted)
    # the reply was ready: its first audio is pulled on the frame after the commit (500 + 20 ms; a reply
    # that starts at the commit plays 20 ms later still: test_session's 540 ms)
    assert started.latency_ms == pytest.approx(520, abs=1e-6)
    (ended,) = h.of(ReplyEnded)
    assert ended.reason == "completed" and ended.kept_text == "hi there"
    assert [list(e) for e in h.session.history.entries] == [["user", "hello"], ["assistant", "hi there"]]


def test_speech_that_resumes_cancels_the_held_reply_and_the_turn_goes_on():
    async def main():
        h = Harness(preemptive_ms=PREEMPT)
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 12)  # a 240 ms pause mid-sentence: a reply starts ...
        ((first, _, _),) = h.responder.started
        h.responder.feed(first, ReplyTextDelta("too soon"), ReplyAudioChunk(tone(0.2)))
        await h.frames(LOUD, 15)  # ... and the user goes on: it is cancelled
        assert h.responder.cancelled == [first]
        await h.frames(QUIET, 25)  # end of turn: a second preemptive reply (at 200 ms), adopted at 500
        (c,) = h.of(UserTurnCommitted)
        h.responder.feed(c.turn_id, ReplyTextDelta("right"), ReplyAudioChunk(tone(0.2)), ReplyDone())
        await h.frames(QUIET, 30)
        return h, first, c

    h, first, c = run(main())
    assert c.turn_id != first and [s[0] for s in h.responder.started] == [first, c.turn_id]
    _, wav, _ = h.responder.started[1]
    assert wav.size == (20 + 12 + 15 + 5) * 320  # the whole turn, pause included
    assert c.speech_ms == 700
    assert "".join(e.text for e in h.of(ReplyText)) == "right"  # nothing of the cancelled reply
    assert [e.turn_id for e in h.of(ReplyStarted)] == [c.turn_id]
    assert [e.reason for e in h.of(ReplyEnded)] == ["completed"]


def test_a_context_change_during_the_pause_restarts_the_reply():
    async def main():
        h = Harness(preemptive_ms=PREEMPT)
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 10)
        ((first, _, history),) = h.responder.started
        h.session.add_message("assistant", "typed meanwhile")  # the context the reply was started on changed
        await h.frames(QUIET, 15)
        return h, first, history

    h, first, history = run(main())
    (c,) = h.of(UserTurnCommitted)
    assert history == [] and h.responder.cancelled == [first]
    (second, wav, history2) = h.responder.started[1]
    assert second == c.turn_id != first and history2 == [["assistant", "typed meanwhile"]]
    assert wav.size == (20 + 5) * 320


@pytest.mark.parametrize("case", ["off", "noise", "over a reply", "manual commit"])
def test_no_preemptive_reply_where_no_turn_would_start(case):
    async def main():
        if case == "off":
            h = Harness()  # preemptive_ms=0
        elif case == "noise":
            h = Harness(TurnConfig(min_turn_ms=300), preemptive_ms=PREEMPT)
        else:
            h = Harness(preemptive_ms=PREEMPT)
        if case == "manual commit":
            h.session.cfg.vad_commit = False
        if case == "over a reply":
            h.session.add_user_text("hi")
            turn_id = h.session.respond()
            h.responder.feed(turn_id, ReplyAudioChunk(tone(3.0)))
            await h.frames(QUIET, 2)
        before = len(h.responder.started)
        await h.frames(LOUD, 10)  # 200 ms of speech (shorter than barge_in_ms and min_turn_ms=300)
        await h.frames(QUIET, 30)
        return h, before

    h, before = run(main())
    assert len(h.responder.started) == before + (1 if case == "off" else 0)
    assert h.responder.cancelled == []


def test_close_during_the_pause_cancels_the_held_reply_and_leaves_no_task():
    async def main():
        h = Harness(preemptive_ms=PREEMPT)
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 10)
        ((turn_id, _, _),) = h.responder.started
        await h.session.close()
        await asyncio.sleep(0)
        return h, turn_id

    h, turn_id = run(main())
    assert h.responder.cancelled == [turn_id] and not h.session.tasks
    assert h.of(ReplyStarted) == [] and h.of(UserTurnCommitted) == []


@pytest.mark.parametrize("ms", [-20, 30])
def test_preemptive_ms_must_be_off_or_whole_frames(ms):
    with pytest.raises(ValueError, match="preemptive_ms"):
        TurnConfig(preemptive_ms=ms)
