"""Incremental transcription of the open turn: the cut policy (pure), the chunk bookkeeping (with a fake
model that records what it decodes), the real chunked transcript against the one-shot one, and the ASR
stage fed the turn in pieces."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from speech import edit_distance, words_of

from omniduplex.models.cascade.asr import SAMPLE_RATE, Transcript
from omniduplex.models.cascade.moonshine import MoonshineASR
from omniduplex.models.cascade.streaming_asr import (
    ChunkCutter,
    ChunkPolicy,
    IncrementalTranscriber,
    split_points,
)
from omniduplex.models.weights import locate_moonshine_base
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.messages import (
    AsrPiece,
    PartialTranscript,
    Prefill,
    StageMessage,
    TurnOptions,
    TurnRequest,
    goes_downstream,
)
from omniduplex.pipeline.stages.asr import ASRWorker

SR = SAMPLE_RATE
SHORT = ChunkPolicy(min_chunk_s=1.0)
"""Chunks of 1 s and more: the synthetic turns below pause after 1.5 s."""


def burst(seconds: float, freq: float = 220.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


def feed(cutter: ChunkCutter, wave: np.ndarray, piece: int) -> list[int]:
    return [c for i in range(0, wave.size, piece) for c in cutter.push(wave[i : i + piece])]


def test_cuts_in_pauses_whatever_the_piece_size():
    wave = np.concatenate([burst(1.5), quiet(0.5), burst(2.0, 300), quiet(0.4), burst(1.2, 180)])
    cuts = feed(ChunkCutter(SHORT), wave, 1600)
    assert len(cuts) == 2
    assert 1.5 * SR < cuts[0] < 2.0 * SR and 4.0 * SR < cuts[1] < 4.4 * SR  # inside each pause
    for piece in (1, 333, 320, 16000, wave.size):
        assert feed(ChunkCutter(SHORT), wave, piece) == cuts, piece


def test_no_chunk_shorter_than_min_and_none_without_speech():
    short_first = np.concatenate([burst(0.4), quiet(0.4), burst(1.5), quiet(0.5), burst(1.0)])
    cuts = ChunkCutter(ChunkPolicy(min_chunk_s=1.0)).push(short_first)
    assert len(cuts) == 1 and cuts[0] > 2.3 * SR  # the pause after 0.4 s is too early to cut
    silent = ChunkCutter().push(quiet(12.0))  # no pause cut without speech; forced cuts only
    assert all(d >= SR for d in np.diff([0, *silent]))


def test_forced_cut_at_the_quietest_point():
    # 7 s of continuous sound with a dip (no pause long enough) at 3.6 s
    wave = np.concatenate([burst(3.6), burst(0.1, amp=0.02), burst(3.3)])
    policy = ChunkPolicy(max_chunk_s=5.0, search_s=2.0)
    cuts = ChunkCutter(policy).push(wave)
    assert len(cuts) == 1
    assert 3.6 * SR <= cuts[0] <= 3.7 * SR
    steady = burst(11.0)
    cuts = ChunkCutter(policy).push(steady)
    assert cuts and all(policy.min_chunk_s * SR <= d <= policy.max_chunk_s * SR for d in np.diff([0, *cuts]))


def test_bad_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="min_chunk_s"):
        ChunkPolicy(min_chunk_s=6.0, max_chunk_s=5.0)


class RecordingASR:
    """Stands in for a model: the text of a wave is its ``[start:end]`` in samples within ``turn`` (every
    sample value of ``turn`` is unique, so the first sample says where the wave starts)."""

    def __init__(self, turn: np.ndarray) -> None:
        self.turn, self.decoded = turn, []

    def transcribe_batch(self, waves):
        out = []
        for w in waves:
            (start,) = np.flatnonzero(self.turn == w[0])
            np.testing.assert_array_equal(self.turn[start : start + w.size], w)
            self.decoded.append((int(start), int(start) + w.size))
            out.append(Transcript(f"[{start}:{start + w.size}]", [], "en", w.size / SR))
        return out


def test_each_closed_chunk_decoded_once_and_only_the_tail_at_end_of_turn():
    wave = np.concatenate([burst(1.5), quiet(0.5), burst(2.0, 300), quiet(0.4), burst(1.2, 180)])
    wave = wave + np.linspace(1e-6, 2e-5, wave.size, dtype=np.float32)  # unique values, still quiet
    cuts = ChunkCutter(SHORT).push(wave)
    assert len(cuts) == 2
    turn = IncrementalTranscriber(SHORT, hypothesis_every_s=None)
    fake = RecordingASR(wave)
    partials = []
    for i in range(0, wave.size, 1600):
        turn.push(wave[i : i + 1600])
        partials.append(turn.step(fake))
    assert turn.bounds == [0, *cuts]
    assert fake.decoded == [(0, cuts[0]), (cuts[0], cuts[1])]  # each closed chunk once, in order
    assert partials[-1].text == f"[0:{cuts[0]}] [{cuts[0]}:{cuts[1]}]"
    before = len(fake.decoded)
    turn.finish()
    assert turn.final_samples == wave.size - cuts[1]  # only the tail is left at end of turn
    turn.step(fake)
    assert fake.decoded[before:] == [(cuts[1], wave.size)] and turn.done
    assert turn.text == f"[0:{cuts[0]}] [{cuts[0]}:{cuts[1]}] [{cuts[1]}:{wave.size}]"
    assert turn.decoded_samples == wave.size  # nothing decoded twice without hypotheses


def test_hypothesis_of_the_open_chunk_every_400_ms():
    turn = IncrementalTranscriber(hypothesis_every_s=0.4, min_hypothesis_s=0.5)
    asked, last = [], ""
    for _ in range(20):  # 2 s of steady sound in 100 ms pieces: no cut
        turn.push(burst(0.1))
        waves = turn.jobs()
        asked.append(len(waves))
        if waves:
            last = f"h{turn.samples}"
        turn.take([last] * len(waves))
    assert turn.bounds == [0]
    n = sum(asked)
    assert 3 <= n <= 4  # at 0.5 s of audio and then every 0.4 s
    p = turn.partial()
    assert p.stable == "" and p.hypothesis == last and p.text == last
    turn.finish()
    assert turn.partial().hypothesis == ""  # the tail is decoded as a chunk now
    assert turn.final_samples == turn.samples


def test_a_hypothesis_that_covers_all_the_sound_is_the_tail_and_nothing_is_left_to_decode():
    turn = IncrementalTranscriber(hypothesis_every_s=0.4, min_hypothesis_s=0.5)
    for _ in range(12):  # 1.2 s of sound, then 0.6 s of silence (the end of turn being detected)
        turn.push(burst(0.1))
        turn.take(["said"] * len(turn.jobs()))
    for _ in range(6):
        turn.push(quiet(0.1))
        turn.take(["said it"] * len(turn.jobs()))
    assert turn.bounds == [0] and turn.partial().hypothesis == "said it"  # decoded over the silence
    turn.finish()
    assert turn.done and turn.final_samples == 0 and turn.jobs() == [] and turn.text == "said it"

    silent_tail = IncrementalTranscriber(SHORT, hypothesis_every_s=None)
    silent_tail.push(np.concatenate([burst(1.5), quiet(0.6)]))  # the pause closed the chunk: a quiet tail
    assert len(silent_tail.bounds) == 2
    silent_tail.take(["said"] * len(silent_tail.jobs()))
    silent_tail.finish()
    assert silent_tail.done and silent_tail.final_samples == 0 and silent_tail.text == "said"

    loud_end = IncrementalTranscriber(hypothesis_every_s=0.4, min_hypothesis_s=0.5)
    for _ in range(12):  # the last hypothesis (at 1.2 s) misses the last 0.1 s of sound: decoded again
        loud_end.push(burst(0.1))
        loud_end.take(["said"] * len(loud_end.jobs()))
    loud_end.push(burst(0.1))
    loud_end.finish()
    assert not loud_end.done and loud_end.final_samples == loud_end.samples


def test_a_pause_asks_for_a_hypothesis_at_once_and_only_once():
    turn = IncrementalTranscriber(hypothesis_every_s=10.0, min_hypothesis_s=0.5)  # no periodic one
    turn.push(burst(1.0))
    assert turn.jobs() == []  # sound to the end: no pause yet
    turn.take([])
    turn.push(quiet(0.06))
    assert turn.jobs() == []  # 60 ms of quiet: not a pause yet
    turn.take([])
    turn.push(quiet(0.06))
    (wave,) = turn.jobs()  # 120 ms of quiet: decode all the sound before the pause now
    assert wave.size == turn.samples
    turn.take(["said"])
    turn.push(quiet(0.2))
    assert turn.jobs() == []  # no new sound since: the hypothesis stands
    turn.take([])
    turn.finish()
    assert turn.done and turn.text == "said"


class CountingASR:
    """Any text; counts the waveforms it was asked to decode."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def transcribe_batch(self, waves):
        self.calls.append(len(waves))
        return [SimpleNamespace(text="said", words=[]) for _ in waves]


@pytest.mark.parametrize("decode_ms, hypotheses", [(0.0, True), (300.0, False), (5000.0, False)])
def test_stage_asks_hypotheses_only_while_the_model_keeps_up(decode_ms, hypotheses):
    worker = ASRWorker(CountingASR(), hypothesis_every_s=0.4)
    piece = StageMessage("t", {"waveform": torch.from_numpy(burst(1.0))}, AsrPiece())
    worker.submit(piece)
    worker.stream_decode_ms = decode_ms  # as if that model's decodes took this long (running mean)
    assert worker.step() == []  # a partial leaves at the next step
    out = worker.step() if worker.has_work() else []
    assert bool(out) == hypotheses and bool(worker.asr.calls) == hypotheses  # the periodic one (≤ 200 ms)
    assert not any(goes_downstream(m) for m in out)  # no conversation given: captions only
    worker.stream_decode_ms = decode_ms
    worker.submit(StageMessage("t", {"waveform": torch.from_numpy(quiet(0.2))}, AsrPiece()))
    worker.step()
    paused = decode_ms <= 1000.0  # the pause hypothesis (≤ 1 s), unless the periodic one covered the sound
    assert len(worker.asr.calls) == (1 if hypotheses else int(paused))


@pytest.fixture(scope="module")
def asr() -> MoonshineASR:
    return MoonshineASR(locate_moonshine_base(), cpu_threads=1)


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """Real speech with pauses: ``moonshine-cpp``'s ``test-data/beckett.wav`` (10 s, six short phrases)."""
    return load_audio(locate_moonshine_base().parents[1] / "test-data" / "beckett.wav", SR)


def within_one_word(a: str, b: str) -> bool:
    return edit_distance(words_of(a), words_of(b)) <= 1


def test_chunked_transcript_matches_one_shot_and_leaves_only_the_tail(asr, speech):
    one_shot = asr.transcribe(speech).text
    turn = IncrementalTranscriber(hypothesis_every_s=None)
    partials = []
    for i in range(0, speech.size, 1600):  # 100 ms pieces, as a session would send them
        turn.push(speech[i : i + 1600])
        partials.append(turn.step(asr).text)
    assert len(turn.bounds) >= 3, turn.bounds  # at least two chunks closed while "speaking"
    assert words_of(partials[-1])  # text while the turn is still open
    turn.finish()
    tail = speech.size - turn.bounds[-2]
    turn.step(asr)
    assert turn.done and turn.final_samples == tail < speech.size / 2
    assert within_one_word(turn.text, one_shot), (turn.text, one_shot)


def test_stage_takes_the_turn_in_pieces(asr, speech):
    worker = ASRWorker(asr, hypothesis_every_s=None)
    meta = TurnRequest(turn=TurnOptions(system_prompt="s"))
    half = speech.size * 3 // 4
    partials = []
    context = Prefill(system_prompt="Be brief.", history=[["user", "hi"], ["assistant", "Hello!"]])
    for i in range(0, half, 3200):
        piece = AsrPiece(prefill=context if i == 0 else None)  # with the first piece
        worker.submit(
            StageMessage("t1", {"waveform": torch.from_numpy(speech[i : min(i + 3200, half)])}, piece)
        )
        while worker.has_work():
            partials += worker.step()
    assert partials and all(not m.last and isinstance(m.meta, PartialTranscript) for m in partials)
    # each partial carries the conversation: a prefill hint for the LLM stage as well as a caption
    assert all(m.meta.prefill == context and goes_downstream(m) for m in partials)
    assert partials[-1].meta.stable_transcript == partials[-1].meta.partial_transcript
    worker.submit(StageMessage("t1", {"waveform": torch.from_numpy(speech[half:])}, meta, last=True))
    out = []
    while worker.has_work():
        out += worker.step()
    final = [m for m in out if m.last]
    assert len(final) == 1 and final[0].meta.options.system_prompt == "s"
    assert final[0].meta.asr_tail_s < speech.size / SR / 2
    assert within_one_word(final[0].meta.transcript, asr.transcribe(speech).text)
    assert partials[-1].meta.stable_transcript in final[0].meta.transcript
    assert worker.streams == {} and not worker.has_work()


def test_a_partial_superseded_by_the_end_of_turn_is_never_sent():
    """A partial waits one step; the turn's end arriving meanwhile (its audio all covered by that
    hypothesis) sends the transcript alone, so the LLM stage does not prefill the same words first."""
    worker = ASRWorker(CountingASR(), hypothesis_every_s=0.4)
    context = Prefill(system_prompt="Be brief.", history=[])
    wave = torch.from_numpy(burst(1.0))
    worker.submit(StageMessage("t", {"waveform": wave}, AsrPiece(prefill=context)))
    assert worker.step() == [] and worker.has_work() and worker.asr.calls == [1]  # its partial held
    end = TurnRequest(turn=TurnOptions(voice="x"))
    worker.submit(StageMessage("t", {"waveform": torch.zeros(0)}, end))  # end of turn, nothing new
    (final,) = worker.step()
    assert final.last and final.meta.options.voice == "x" and final.meta.transcript == "said"
    assert worker.asr.calls == [1] and not worker.has_work()  # covered: no decode, no partial
    # without the end of turn the held partial goes out, with its prefill context
    worker.submit(StageMessage("u", {"waveform": wave}, AsrPiece(prefill=context)))
    assert worker.step() == []
    (partial,) = worker.step()
    assert not partial.last and partial.meta.partial_transcript == "said" and goes_downstream(partial)
    worker.abort("u")
    assert not worker.has_work()


class BeamASR(CountingASR):
    """A beam-search model: records the beam each call asked for (``None``: its own)."""

    beam = 4

    def __init__(self) -> None:
        super().__init__()
        self.beams: list[int | None] = []

    def transcribe_batch(self, waves, beam=None):
        self.beams.append(beam)
        return super().transcribe_batch(waves)


def test_a_step_with_several_turns_decodes_greedily_and_one_turn_keeps_the_beam():
    worker = ASRWorker(BeamASR(), hypothesis_every_s=None)
    wave = torch.from_numpy(burst(1.0))
    worker.submit(StageMessage("a", {"waveform": wave}, TurnRequest(), last=True))
    (one,) = worker.step()
    assert one.meta.transcript == "said" and worker.asr.beams == [None] and worker.greedy_steps == 0
    for rid in ("b", "c"):  # two callers' turns end together: decoded in turn, greedily
        worker.submit(StageMessage(rid, {"waveform": wave}, TurnRequest(), last=True))
    assert len(worker.step()) == 2 and worker.asr.calls[-1] == 2
    assert worker.asr.beams == [None, 1] and worker.greedy_steps == 1
    # a model without a beam is never asked for one; greedy_from=None keeps the beam under load
    plain = ASRWorker(CountingASR(), hypothesis_every_s=None)
    steady = ASRWorker(BeamASR(), hypothesis_every_s=None, greedy_from=None)
    for w in (plain, steady):
        for rid in ("b", "c"):
            w.submit(StageMessage(rid, {"waveform": wave}, TurnRequest(), last=True))
        assert len(w.step()) == 2
    assert steady.asr.beams == [None] and plain.greedy_steps == steady.greedy_steps == 0


def test_moonshine_beam_per_call_equals_the_model_at_that_beam(asr, speech):
    clip = speech[: 3 * SR]
    greedy = MoonshineASR(locate_moonshine_base(), cpu_threads=1, beam=1)
    assert asr.beam > 1
    assert asr.transcribe_batch([clip], beam=1)[0].text == greedy.transcribe(clip).text
    assert asr.transcribe_batch([clip])[0].text == asr.transcribe(clip).text
    with pytest.raises(ValueError, match="beam must be >= 1"):
        asr.transcribe_batch([clip], beam=0)


def test_stage_rejects_a_too_short_streamed_turn_and_aborts(asr):
    worker = ASRWorker(asr)
    worker.submit(StageMessage("t", {"waveform": torch.zeros(100)}, AsrPiece()))
    with pytest.raises(ValueError, match="at least"):
        worker.submit(StageMessage("t", {"waveform": torch.zeros(100)}, TurnRequest(), last=True))
    assert worker.streams == {}
    worker.submit(StageMessage("u", {"waveform": torch.zeros(4000)}, AsrPiece()))
    worker.abort("u")
    assert worker.streams == {} and not worker.has_work()


def test_split_points_cover_the_whole_utterance():
    wave = np.concatenate([burst(1.5), quiet(0.5), burst(2.0, 300)])
    b = split_points(wave, SHORT)
    assert b[0] == 0 and b[-1] == wave.size and len(b) == 3
