"""Piper TTS (real en_US joe voice) and the cascade's TTS stage worker: clause streaming, alignment, abort,
fairness between concurrent turns. Speech is checked by ear's proxy: Whisper transcribes it back."""

from __future__ import annotations

import re

import numpy as np
import pytest
import soxr
from pydantic import ValidationError
from speech import wer

from omniduplex.models.cascade.asr import SAMPLE_RATE, WhisperASR
from omniduplex.models.cascade.piper_stream import FIRST_PIECE_FRAMES
from omniduplex.models.cascade.tts import PiperTTS
from omniduplex.models.weights import PIPER_JOE, PIPER_JOE_CONFIG, WHISPER_TINY_EN, locate
from omniduplex.pipeline.messages import AudioOutput, DecoderOutput, StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.stages.tts import TTSWorker
from omniduplex.pipeline.text.clauses import MARKDOWN, count_words

OUT_RATE = 24_000
REPLY = (
    "Sure! The museum opens at nine in the morning on Sundays, and it closes at six in the evening. "
    "Tickets cost twelve euros for adults; children under ten get in for free. "
    "I would book online, because the queue at the door can be long."
)


def test_wer_helper():
    assert wer("the cat sat", "The cat sat.") == 0.0
    assert wer("the cat sat", "the cat") == pytest.approx(1 / 3)
    assert wer("a b c d", "a x c d e") == pytest.approx(2 / 4)


class Recording:
    """The real voice, keeping what each clause's stream produced (at the voice's rate, pieces joined)."""

    def __init__(self, tts: PiperTTS) -> None:
        self.tts, self.pieces = tts, []

    @property
    def sample_rate(self) -> int:
        return self.tts.sample_rate

    def stream(self, text: str, first_frames: int | None):
        self.pieces.append((text, []))
        for p in self.tts.stream(text, first_frames):
            self.pieces[-1][1].append(p.pcm)
            yield p

    @property
    def calls(self) -> list[tuple[str, np.ndarray]]:
        return [(text, np.concatenate(pcm)) for text, pcm in self.pieces]


@pytest.fixture(scope="module")
def tts() -> PiperTTS:
    return PiperTTS(locate(PIPER_JOE), locate(PIPER_JOE_CONFIG), threads=1)


@pytest.fixture(scope="module")
def asr() -> WhisperASR:
    return WhisperASR(locate(WHISPER_TINY_EN).parent)


def tokens(text: str) -> list[str]:
    """``text`` as an LLM streams it: words with their leading space, punctuation as its own token."""
    return re.findall(r"\s*\w+|\s*[^\w\s]", text)


def feed(worker: TTSWorker, rid: str, text: str, last: bool = True, turn: TurnOptions | None = None) -> None:
    """``text`` as the LLM stage sends it, token by token; ``turn``: the options on its first message."""
    toks = tokens(text) or [""]
    for i, tok in enumerate(toks):
        meta = DecoderOutput(text=tok, turn=turn if i == 0 else None)
        worker.submit(StageMessage(rid, {}, meta, last=last and i == len(toks) - 1))


def drain(worker: TTSWorker) -> list[StageMessage]:
    outs = []
    while worker.has_work():
        outs += worker.step()
    return outs


def norm(s: str) -> str:
    return "".join(c for c in s if not c.isspace() and c not in MARKDOWN)


def test_voice(tts):
    assert tts.sample_rate == 22050
    assert tts.voices == ["joe"]
    pcm = tts.synthesize("Hello there.")
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    assert 0.3 < pcm.size / tts.sample_rate < 3.0
    assert 0.05 < np.abs(pcm).max() <= 1.0
    assert tts.synthesize("...").size == 0  # nothing to pronounce


def test_speech_is_intelligible(tts, asr):
    text = "Today the weather is sunny and warm, so we can go for a long walk in the park."
    pcm = soxr.resample(tts.synthesize(text), tts.sample_rate, SAMPLE_RATE).astype(np.float32)
    heard = asr.transcribe(pcm).text
    assert wer(text, heard) <= 0.10, heard


def test_streamed_reply_chunks_align_with_text_and_audio(tts, asr):
    rec = Recording(tts)
    w = TTSWorker(rec, output_rate=OUT_RATE)  # type: ignore[arg-type]
    outs = []
    for i, tok in enumerate(tokens(REPLY)):  # one token at a time, stepping like the stage loop does
        w.submit(StageMessage("r", {}, DecoderOutput(text=tok, turn=TurnOptions() if i == 0 else None)))
        outs += drain(w)
    w.submit(StageMessage("r", {}, DecoderOutput(text=""), last=True))
    outs += drain(w)

    *pieces, final = outs
    assert final.last and final.meta.text == "" and final.tensors["pcm"].numel() == 0
    assert not any(m.last for m in pieces)
    assert all(isinstance(m.meta, AudioOutput) and m.meta.skipped is None for m in outs)
    # a clause's pieces are consecutive; its text rides on its last piece
    chunks = [m for m in pieces if m.meta.text]
    assert [m.meta.chunk for m in chunks] == list(range(len(chunks)))
    assert [m.meta.chunk for m in pieces] == sorted(m.meta.chunk for m in pieces)
    assert len(pieces) > len(chunks)  # the first clause came in more than one piece
    # every character of the reply is spoken by exactly one chunk, in order
    texts = [m.meta.text for m in chunks]
    assert norm("".join(texts)) == norm(REPLY)
    assert texts == [t for t, _ in rec.calls]  # each clause's audio is the synthesis of its own text
    assert texts[0] == "Sure!" and all(count_words(t) >= 3 for t in texts[1:])
    assert count_words(texts[0]) <= 6  # a short first clause: early first audio
    # the chunks are one continuous 24 kHz waveform: the turn's 22.05 kHz audio resampled in one go
    pcm = np.concatenate([m.tensors["pcm"].numpy() for m in outs])
    assert pcm.dtype == np.float32
    raw = np.concatenate([p for _, p in rec.calls])
    whole = soxr.ResampleStream(tts.sample_rate, OUT_RATE, 1, dtype="float32", quality="HQ")
    np.testing.assert_allclose(pcm, whole.resample_chunk(raw, last=True), atol=1e-6)
    assert abs(pcm.size - raw.size * OUT_RATE / tts.sample_rate) <= 2
    for i, (_, p) in enumerate(rec.calls):  # each clause's pieces carry its own samples, shifted by
        # the resampler's delay (~37 ms for soxr HQ at 22.05 → 24 kHz)
        n = sum(m.tensors["pcm"].numel() for m in pieces if m.meta.chunk == i)
        assert abs(n - p.size * OUT_RATE / tts.sample_rate) < 0.05 * OUT_RATE
    # and it says the reply
    heard = asr.transcribe(soxr.resample(pcm, OUT_RATE, SAMPLE_RATE).astype(np.float32)).text
    assert wer(REPLY, heard) <= 0.2, heard


def test_first_clause_is_cut_early_and_starts_with_a_short_piece(tts):
    w = TTSWorker(tts)
    feed(w, "r", "I would be very happy to help you plan a trip to the seaside next week.")
    outs = drain(w)
    first = [m for m in outs if m.meta.chunk == 0]
    assert [m.meta.text for m in first][-1] == "I would be very happy to"
    assert all(m.meta.text == "" for m in first[:-1]) and len(first) >= 2
    # the first piece: FIRST_PIECE_FRAMES latent frames (256 samples each at 22.05 kHz) less the
    # resampler's delay, so the listener hears the turn after the acoustic part and one short decode
    full = FIRST_PIECE_FRAMES * 256 * OUT_RATE / tts.sample_rate
    assert outs[0].meta.tts_ms > 0 and 0.8 * full < outs[0].tensors["pcm"].numel() <= full
    assert sum(m.tensors["pcm"].numel() for m in first) > 0.5 * OUT_RATE


def test_abort_mid_turn_emits_nothing_more(tts):
    w = TTSWorker(tts)
    feed(w, "r", "First, a short clause. Then a second sentence comes here. And a third one", last=False)
    first = w.step()
    assert [m.meta.chunk for m in first] == [0] and first[0].tensors["pcm"].numel() > 0
    w.abort("r")
    assert not w.has_work() and w.step() == []
    feed(w, "r", " arrives late from the language model.")  # text already in flight when the abort landed
    assert not w.has_work() and w.step() == []


def test_concurrent_turns_alternate(tts):
    w = TTSWorker(tts)
    long = " ".join(f"This is sentence number {n} of a rather long answer." for n in range(1, 9))
    feed(w, "long", long)
    assert [m.request_id for m in w.step()] == ["long"]
    assert [m.request_id for m in w.step()] == ["long"]
    feed(w, "new", "Hello! Nice to meet you, how can I help today?")
    step = w.step()
    assert [m.request_id for m in step] == ["new"]  # a new turn's first piece goes first, alone
    assert step[0].meta.chunk == 0 and step[0].tensors["pcm"].numel() > 0
    order = []
    while w.has_work():
        step = w.step()
        assert len([m for m in step if not m.last]) <= 1  # one piece per step: its audio leaves at once
        order += [m.request_id for m in step if not m.last]
    assert order[:4] == ["long", "new", "long", "new"]  # then they take turns
    assert order[-1] == "long"


def test_new_turns_first_clauses_go_out_one_per_step_in_arrival_order(tts):
    w = TTSWorker(tts)
    for rid in ("a", "b", "c"):
        feed(w, rid, f"Reply {rid} starts here. And it goes on for a while longer.")
    firsts = [w.step() for _ in range(3)]
    assert [[m.request_id for m in s] for s in firsts] == [["a"], ["b"], ["c"]]
    assert all(s[0].meta.chunk == 0 and s[0].tensors["pcm"].numel() > 0 for s in firsts)


def test_each_clause_first_piece_reports_its_wait_behind_other_turns(tts):
    w = TTSWorker(tts)
    for rid in ("a", "b", "c"):
        feed(w, rid, f"Reply {rid} starts here. And it goes on for a while longer.")
    firsts = [w.step()[0] for _ in range(3)]
    waits = [m.meta.tts_wait_ms for m in firsts]
    synth = [m.meta.tts_ms for m in firsts]
    assert all(x is not None and x >= 0 for x in waits)
    # b's clause was ready before a's piece was made, c's before a's and b's: they waited that long at least
    assert waits[1] >= synth[0] and waits[2] >= synth[0] + synth[1]
    rest = drain(w)
    pieces = [m for m in rest if not m.last and m.tensors["pcm"].numel()]
    assert any(m.meta.tts_wait_ms is None for m in pieces)  # a clause's later pieces carry none


def test_empty_reply_ends_with_one_empty_message(tts):
    w = TTSWorker(tts)
    skipped = DecoderOutput(text="", skipped="empty transcript", turn=TurnOptions())
    w.submit(StageMessage("e", {}, skipped, last=True))
    (out,) = drain(w)
    assert out.last and out.tensors["pcm"].numel() == 0
    assert out.meta == AudioOutput(text="", skipped="empty transcript")  # the LLM's skip passed on
    feed(w, "m", "** 🙂 **")  # only markup: nothing to say
    (out,) = drain(w)
    assert out.last and out.tensors["pcm"].numel() == 0


def test_bad_text_raises_for_that_turn(tts):
    w = TTSWorker(tts)
    with pytest.raises(ValidationError, match="text"):  # text of the wrong type: no message
        DecoderOutput(text=3)
    with pytest.raises(ValueError, match="DecoderOutput"):  # a message of another kind
        w.submit(StageMessage("bad", {}, Transcript(transcript="hi")))
    feed(w, "good", "Still here.")
    assert drain(w)[-1].last


def test_text_only_turn_gets_no_audio_and_others_are_spoken(tts):
    """A ``spoken: false`` turn (``/v1/chat/completions``) ends with its closing message and no audio; a turn
    beside it is spoken as usual."""
    w = TTSWorker(tts)
    feed(w, "chat", "Seven days are in a week. That is all.", turn=TurnOptions(spoken=False))
    feed(w, "voice", "Hello there, nice to meet you.")
    outs = drain(w)
    chat = [m for m in outs if m.request_id == "chat"]
    voice = [m for m in outs if m.request_id == "voice"]
    assert len(chat) == 1 and chat[0].last and chat[0].tensors["pcm"].numel() == 0
    assert sum(m.tensors["pcm"].numel() for m in voice) > tts.sample_rate // 2 and voice[-1].last
