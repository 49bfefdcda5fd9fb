"""Live transcription: the session feeds the turn being spoken to the ASR stage, partial transcripts come back
as captions (and Realtime deltas) before the final transcript, and the reply answers the final transcript.

The end-to-end tests run the real ASR (Whisper tiny.en, the default, and Moonshine base) on a real recording
(``examples/question.wav``) through a :class:`Session`, an :class:`OrchestratorResponder` and the in-process
backend; the LLM and TTS stages are stand-ins that answer with the transcript they were given.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from omniduplex.app.core.events import UserTranscriptEvent, UserTranscriptPartial, UserTurnCommitted
from omniduplex.app.core.live_asr import AgreedPrefix, LiveTranscriber
from omniduplex.app.core.replies import OrchestratorResponder
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.vad import TurnConfig, WebRtcVad
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.messages import (
    AudioOutput,
    DecoderOutput,
    PartialTranscript,
    Prefill,
    StageMessage,
    Transcript,
)
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.stages.asr import ASRWorker
from omniduplex.pipeline.stages.contract import BatchGauges, WorkerBase
from omniduplex.pipeline.topology import CASCADE

QUESTION = Path(__file__).resolve().parents[1] / "examples" / "question.wav"
"""Says: "Hello? Can you tell me what the weather will be like tomorrow in Paris?" (3.9 s)."""


def test_agreed_prefix_sends_each_agreed_word_once_and_never_revises():
    a = AgreedPrefix()
    assert a.update("can you", "") == ""  # one partial: nothing agreed yet
    assert a.update("can you tell", "") == "can you"
    assert a.update("can you tell me", "") == " tell"
    assert a.update("can you sell me what", "") == ""  # "tell" revised: nothing new is agreed
    assert a.update("can you tell me what the", "can you tell me") == " me"  # the stable prefix is agreed
    assert a.update("can you tell me what the weather", "") == " what the"
    assert a.sent == ["can", "you", "tell", "me", "what", "the"]


class FakeFeeder:
    """A responder that can transcribe live: records what it was fed and cancelled."""

    output_rate = 24000

    def __init__(self, supported: bool = True) -> None:
        self.supported, self.fed, self.cancelled, self.started = supported, {}, [], []
        self.partial, self.contexts = {}, {}

    def feed_audio(self, turn_id, samples, on_partial, context=None) -> bool:
        if not self.supported:
            return False
        self.contexts.setdefault(turn_id, []).append(context)
        self.fed.setdefault(turn_id, []).append(samples)
        self.partial[turn_id] = on_partial
        return True

    def cancel(self, turn_id) -> None:
        self.cancelled.append(turn_id)


def test_live_transcriber_feeds_every_feed_ms_and_cancels_a_segment_that_is_no_turn():
    events, ids = [], iter(["s-1", "s-2"])
    r = FakeFeeder()
    live = LiveTranscriber("s", r, events.append, lambda: next(ids), feed_ms=100)
    frames = []
    for i in range(12):
        frames.append(np.full(320, i, np.int16))
        live.update(frames, in_speech=True)
    assert [len(x) for x in r.fed["s-1"]] == [5 * 320, 5 * 320]  # every 100 ms (5 frames); 2 left over
    assert np.array_equal(np.concatenate(r.fed["s-1"]), np.concatenate(frames[:10]) / 32768.0)
    r.partial["s-1"]("hello there", "")
    r.partial["s-1"]("hello there you", "hello")
    assert [(e.turn_id, e.text, e.delta) for e in events] == [
        ("s-1", "hello there", ""),
        ("s-1", "hello there you", "hello there"),
    ]
    live.update([], in_speech=False)  # the segment ended as noise: cancelled in the pipeline
    assert r.cancelled == ["s-1"] and live.take() is None
    r.partial["s-1"]("late", "")  # a partial after the drop is not shown
    assert len(events) == 2
    for i in range(5):
        live.update(frames[: i + 1], in_speech=True)
    assert live.take() == "s-2" and r.cancelled == ["s-1"]  # a turn: committed under its fed id


def test_captions_of_a_segment_go_on_after_its_fed_turn_was_taken_by_a_preemptive_reply():
    events, ids = [], iter(["s-1", "s-2", "s-3"])
    r = FakeFeeder()
    live = LiveTranscriber("s", r, events.append, lambda: next(ids), feed_ms=100)
    frames = [np.ones(320, np.int16)] * 5
    live.update(frames, in_speech=True)
    r.partial["s-1"]("what is the", "what is")
    assert live.take() == "s-1"  # a preemptive reply took the turn so far; then the user went on
    frames += [np.ones(320, np.int16)] * 5
    live.update(frames, in_speech=True)
    assert [len(x) for x in r.fed["s-2"]] == [10 * 320]  # the whole segment again, under a new id
    r.partial["s-2"]("what is the weather", "what is the")
    assert [(e.turn_id, e.delta) for e in events] == [("s-1", "what is"), ("s-2", " the")]  # no repeat
    assert live.take() == "s-2"
    live.update([np.ones(320, np.int16)] * 5, in_speech=True)  # a new segment: captions start afresh
    r.partial["s-3"]("hello", "hello")
    assert events[-1].delta == "hello"


def test_live_transcriber_feeds_at_once_when_a_pause_begins():
    r = FakeFeeder()
    live = LiveTranscriber("s", r, lambda e: None, lambda: "s-1", feed_ms=400)
    frames = [np.ones(320, np.int16)] * 7
    live.update(frames, in_speech=True)
    assert r.fed == {}  # 140 ms: not yet
    live.update(frames, in_speech=True, pause=True)
    assert [len(x) for x in r.fed["s-1"]] == [7 * 320]
    live.update(frames, in_speech=True, pause=True)  # nothing new: nothing fed
    assert len(r.fed["s-1"]) == 1


def test_live_transcriber_does_nothing_for_a_responder_that_cannot():
    r = FakeFeeder(supported=False)
    live = LiveTranscriber("s", r, lambda e: None, lambda: "s-1", feed_ms=20)
    live.update([np.zeros(320, np.int16)], in_speech=True)
    assert live.take() is None and not live.supported and r.cancelled == []


# -- end to end, real ASR ----------------------------------------------------------------------------------
class EchoLLM(BatchGauges):
    """LLM stand-in: answers each turn with ``You said: <transcript>`` in one token message; keeps the
    prefill hints (partial transcripts with the conversation) it got before in ``hints``."""

    def __init__(self) -> None:
        self.pending: list[StageMessage] = []
        self.max_batch = 8
        self.seen: list[Transcript] = []
        self.hints: list[StageMessage] = []

    def submit(self, msg: StageMessage) -> None:
        if not msg.last and isinstance(msg.meta, PartialTranscript):
            self.hints.append(msg)
            return
        if not isinstance(msg.meta, Transcript):
            raise ValueError(f"turn {msg.request_id}: the LLM got a message without a transcript: {msg.meta}")
        self.seen.append(msg.meta)
        self.pending.append(msg)

    def abort(self, request_id: str) -> None:
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[StageMessage]:
        out, self.pending = self.pending, []
        token = {"token": torch.zeros(1, dtype=torch.int64)}
        said = [(m.request_id, f"You said: {m.meta.transcript}") for m in out]
        return [StageMessage(rid, token, DecoderOutput(text=text), True) for rid, text in said]


class ToneTTS(WorkerBase):
    """TTS stand-in: 0.1 s of a tone per finished turn (24 kHz), with the words it speaks."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}
        self.done: list[str] = []

    def submit(self, msg: StageMessage) -> None:
        assert isinstance(msg.meta, DecoderOutput)
        self.pending[msg.request_id] = self.pending.get(msg.request_id, "") + (msg.meta.text or "")
        if msg.last:
            self.done.append(msg.request_id)

    def abort(self, request_id: str) -> None:
        self.pending.pop(request_id, None)
        self.done = [r for r in self.done if r != request_id]

    def has_work(self) -> bool:
        return bool(self.done)

    def stats(self) -> dict[str, int]:
        return {"queue_depth": 0, "batch_size": len(self.pending)}

    def step(self) -> list[StageMessage]:
        out, self.done = self.done, []
        pcm = torch.sin(torch.arange(2400) * 0.05).float() * 0.3
        return [
            StageMessage(r, {"pcm": pcm}, AudioOutput(text=self.pending.pop(r), tts_ms=1.0), True)
            for r in out
        ]


class RecordingASR(ASRWorker):
    """The real ASR worker, keeping its final messages (``asr_tail_s``: the audio left at end of turn) and
    counting the pieces it has finished a step after (``stepped``)."""

    received = stepped = 0
    finals: list[StageMessage] = []

    def submit(self, msg):
        super().submit(msg)
        self.received += 1

    def step(self):
        received = self.received
        out = super().step()
        self.finals = self.finals + [m for m in out if m.last]
        self.stepped = received
        return out


class CountingResponder(OrchestratorResponder):
    def __init__(self, orch) -> None:
        super().__init__(orch)
        self.feeds = 0

    def feed_audio(self, turn_id, samples, on_partial, context=None) -> bool:
        self.feeds += 1
        return super().feed_audio(turn_id, samples, on_partial, context)


def _asr(kind: str):
    if kind == "whisper":
        from omniduplex.models.cascade.asr import WhisperASR
        from omniduplex.models.weights import WHISPER_TINY_EN, locate

        return WhisperASR(locate(WHISPER_TINY_EN).parent, cpu_threads=1)
    from omniduplex.models.cascade.moonshine import MoonshineASR
    from omniduplex.models.weights import locate_moonshine_base

    return MoonshineASR(locate_moonshine_base(), cpu_threads=1)


async def _until(cond, timeout_s: float = 120.0) -> None:
    """Wait (polling the event loop) until ``cond()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["whisper", "moonshine"])
def test_partials_come_before_the_final_transcript_and_the_reply_uses_the_final_one(kind):
    # hypotheses whatever the decode time (this machine may be loaded): the path is under test, not the pacing
    asr = RecordingASR(_asr(kind), hypothesis_budget=float("inf"), pause_budget_ms=float("inf"))
    llm, tts = EchoLLM(), ToneTTS()
    speech = (load_audio(QUESTION) * 32767).astype(np.int16)
    audio = np.concatenate([np.zeros(8000, np.int16), speech, np.zeros(24000, np.int16)])
    frames = [audio[i : i + 320] for i in range(0, audio.size - 319, 320)]

    async def main():
        backend = LocalBackend({"asr": asr, "llm": llm, "tts": tts}, CASCADE)
        orch = Orchestrator(backend, None, output_rate=24000)
        await orch.start()
        events = []
        # one fed turn, one final (no preemptive reply in the pauses: tests/test_preemptive.py)
        cfg = SessionConfig(turn=TurnConfig(endpoint_ms=700, preemptive_ms=0), output_rate=24000)
        responder = CountingResponder(orch)
        session = Session("s", responder, events.append, cfg, WebRtcVad(2))
        try:
            for f in frames:
                session.push_audio(f)
                session.pull_audio(480)
                # the user speaks in real time: the ASR has stepped over each piece before the next 20 ms
                await _until(lambda: asr.stepped >= responder.feeds)
            await _until(lambda: any(isinstance(e, UserTranscriptEvent) for e in events))
            await _until(lambda: not session.busy or session.queued_samples > 0)
            while session.busy:  # play the reply out, so it completes
                session.pull_audio(480)
                await asyncio.sleep(0)
            return events, session.history.snapshot()
        finally:
            await session.close()
            await orch.stop()

    events, history = asyncio.run(main())
    (committed,) = [e for e in events if isinstance(e, UserTurnCommitted)]
    (final,) = [e for e in events if isinstance(e, UserTranscriptEvent)]
    partials = [e for e in events if isinstance(e, UserTranscriptPartial)]
    assert partials, "no partial transcript while the user spoke"
    assert all(events.index(p) < events.index(final) for p in partials)
    assert {p.turn_id for p in partials} == {committed.turn_id} == {final.turn_id}
    assert any("weather" in p.text.lower() for p in partials), [p.text for p in partials]
    heard = final.text.lower()
    assert "weather" in heard and "paris" in heard and "tomorrow" in heard
    # the deltas joined are a prefix of a partial, all before the turn ended
    joined = "".join(p.delta for p in partials)
    assert joined and any(p.text.startswith(joined) for p in partials)
    # only the tail was left to decode at end of turn, and the reply answered the final transcript
    (done,) = asr.finals
    assert done.meta.transcript == final.text and done.meta.asr_tail_s < len(speech) / 16000
    assert [m.transcript for m in llm.seen] == [final.text]
    assert history == [["user", final.text.strip()], ["assistant", f"You said: {final.text}"]]
    # the LLM got the partials as prefill hints, with the conversation the turn was answered in
    assert [h.meta.partial_transcript for h in llm.hints] == [p.text for p in partials]
    assert {h.request_id for h in llm.hints} == {committed.turn_id}
    context = Prefill(system_prompt=llm.seen[0].options.system_prompt, history=[])
    assert all(h.meta.prefill == context for h in llm.hints)
