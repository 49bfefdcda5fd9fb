"""Typed stage messages (pipeline/messages.py): each kind keeps its fields, the same object comes back from
the wire, a bad wire meta is refused naming the field, and a stage's message that does not fit fails its
own turn only, in-process and across stage processes."""

import os
import shutil
import threading
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from omniduplex.app.host.pipeline import default_model
from omniduplex.models.cascade.tts import PiperTTS
from omniduplex.models.weights import PIPER_JOE, PIPER_JOE_CONFIG, locate
from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.events import CallArgumentsDelta, CallDone, CallFailed, CallStarted
from omniduplex.pipeline.messages import (
    KINDS,
    AsrPiece,
    AudioOutput,
    DecoderOutput,
    EdgeMessageError,
    Encoded,
    PartialTranscript,
    Prefill,
    StageError,
    StageMessage,
    Transcript,
    TurnOptions,
    TurnRequest,
    UtteranceRequest,
    goes_downstream,
    is_partial_transcript,
    meta_from_wire,
    meta_to_wire,
    validated,
)
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.runtime.process_backend import ProcessBackend
from omniduplex.pipeline.runtime.stage_process import META_KEY, pack, unpack
from omniduplex.pipeline.stages.contract import BatchGauges
from omniduplex.pipeline.stages.tts import TTSWorker
from omniduplex.pipeline.topology import CASCADE

TURN = TurnOptions(
    system_prompt="be brief",
    history=[["user", "a"], {"type": "function_call_output", "call_id": "c1", "output": "8"}],
    sampling={"temperature": 0.0, "max_tokens": 8},
    voice="joe",
    tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    tool_choice="auto",
    spoken=False,
)
HINT = Prefill(system_prompt="", history=[])
SAMPLES = [  # one of every kind, with its own fields set
    TurnRequest(turn=TURN),
    AsrPiece(prefill=Prefill(system_prompt="s", history=[["user", "hi"]])),
    UtteranceRequest(text="Hello.", instructions="calm", language="en", ref_text="Hi.", turn=TURN),
    Transcript(transcript="hi", words=[["hi", 0.0, 0.2]], asr_ms=12.5, asr_tail_s=0.3, turn=TURN),
    PartialTranscript(partial_transcript="he", stable_transcript="h", prefill=HINT),
    Encoded(turn=TURN),
    DecoderOutput(text="Sure.", finish_reason="stop", unspoken=" and", skipped=None, talker_ms=3.0),
    DecoderOutput(call_started=CallStarted("c1", "f", 0), call_delta=CallArgumentsDelta("c1", '{"a"')),
    DecoderOutput(call_done=CallDone("c1", "f", '{"a": 1}'), call_failed=CallFailed("c2", "g", "cut off")),
    AudioOutput(text="Sure.", chunk=2, tts_ms=4.0, talker_ms=1.0, codec_ms=2.0, skipped="empty transcript"),
    StageError(error="llm: boom", stage="llm"),
]


def test_every_kind_has_a_sample():
    assert {type(m).__name__ for m in SAMPLES} == set(KINDS)


def test_kind_keeps_its_fields_and_the_turn_options():
    t = Transcript(transcript="hi", words=[["hi", 0.0, 0.2]], asr_ms=12.5, turn=TURN)
    assert t.transcript == "hi" and t.asr_ms == 12.5 and t.options.system_prompt == "be brief"
    assert t.options.history[1]["call_id"] == "c1" and t.options.sampling["max_tokens"] == 8
    assert Transcript(transcript="x").turn is None and Transcript(transcript="x").options == TurnOptions()
    calls = SAMPLES[7]
    assert calls.calls == [calls.call_started, calls.call_delta]  # in the order a call's events come
    assert [type(e) for e in SAMPLES[8].calls] == [CallDone, CallFailed]
    with pytest.raises(ValidationError, match="metadata"):  # a key no kind declares
        Transcript(transcript="x", metadata={"k": 1})
    with pytest.raises(ValidationError, match="text"):
        UtteranceRequest()  # a required field
    with pytest.raises(EdgeMessageError, match=r"request r: AudioOutput: tts_ms"):
        validated(AudioOutput, {"text": "x", "tts_ms": "slow"}, "r")


@pytest.mark.parametrize("meta", SAMPLES, ids=lambda m: type(m).__name__)
def test_the_wire_gives_back_an_equal_object(meta):
    back = meta_from_wire(meta_to_wire(meta), "r")
    assert type(back) is type(meta) and back == meta
    # and through a stage edge's tensors, as a stage process packs and unpacks it
    tensors = pack(StageMessage("7", {"token": torch.tensor([3])}, meta, last=True), ("llm", "tts"), CASCADE)
    msg = unpack(7, tensors, True)
    assert msg.meta == meta and msg.request_id == "7" and msg.last and META_KEY not in msg.tensors


@pytest.mark.parametrize(
    ("wire", "named"),
    [
        (b'Transcript\0{"transcript": 3}', "Transcript: transcript"),
        (b'AudioOutput\0{"tts_ms": "slow"}', "AudioOutput: tts_ms"),
        (b'AudioOutput\0{"pcm_ms": 1}', "pcm_ms"),  # a field the kind does not declare
        (b'DecoderOutput\0{"call_done": {"call_id": "c", "name": "f"}}', r"call_done\.arguments"),
        (b'Transcript\0{"turn": {"history": "not a list"}}', r"turn\.history"),
        (b'AsrPiece\0{"prefill": {"history": []}}', r"prefill\.system_prompt"),
        (b"UtteranceRequest\0{}", "UtteranceRequest: text"),
        (b'SpeechRequest\0{"text": "hi"}', "SpeechRequest"),  # an unknown kind
        (b'{"text": "hi"}', "no known kind"),  # no kind tag
        (b"Transcript\0not json", "Transcript: .*JSON"),
    ],
)
def test_a_bad_wire_meta_is_refused_naming_the_field(wire, named):
    with pytest.raises(EdgeMessageError, match=named) as e:
        meta_from_wire(wire, "r9")
    assert "request r9" in str(e.value)


def test_partial_transcripts_go_downstream_only_with_their_prefill():
    caption = StageMessage("r", {}, PartialTranscript(partial_transcript="he"))
    context = Prefill(system_prompt="", history=[])
    hint = StageMessage("r", {}, PartialTranscript(partial_transcript="he", prefill=context))
    final = StageMessage("r", {}, Transcript(transcript="hello"), last=True)
    assert is_partial_transcript(caption) and is_partial_transcript(hint) and not is_partial_transcript(final)
    assert not goes_downstream(caption) and goes_downstream(hint) and goes_downstream(final)


class _Stage(BatchGauges):
    """Answers each message at once with ``answer(msg)``: a stage whose output may not fit the next one."""

    max_batch = 8

    def __init__(self, answer):
        self.pending, self.answer = [], answer

    def submit(self, msg):
        self.pending.append(msg)

    def abort(self, request_id):
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self):
        return bool(self.pending)

    def step(self):
        out, self.pending = self.pending, []
        return [StageMessage(m.request_id, {"token": torch.zeros(0, dtype=torch.int64)}, self.answer(m), True)
                for m in out]  # fmt: skip


def test_a_stage_message_that_does_not_fit_fails_its_turn_only_in_process():
    """The LLM stage answers turn ``bad`` with an audio stage's kind (not the ``DecoderOutput`` the TTS stage
    takes): that turn fails, naming the LLM stage and the kind, and reaches neither the orchestrator nor the
    TTS stage; turn ``good`` beside it is spoken by the real TTS stage."""
    outputs, done = [], threading.Event()

    def on_output(msg):
        outputs.append(msg)
        ends = [m for m in outputs if m.last and isinstance(m.meta, (AudioOutput, StageError))]
        if {m.request_id for m in ends} == {"bad", "good"}:
            done.set()

    def llm(msg):
        if msg.request_id == "bad":
            return AudioOutput(text="not a decoder output")
        return DecoderOutput(text="Hello there, nice to meet you.", turn=msg.meta.turn)

    asr = _Stage(lambda m: Transcript(transcript="hi", turn=m.meta.turn))
    tts = TTSWorker(PiperTTS(locate(PIPER_JOE), locate(PIPER_JOE_CONFIG), threads=1))
    backend = LocalBackend({"asr": asr, "llm": _Stage(llm), "tts": tts}, CASCADE)
    backend.start(on_output)
    try:
        for rid in ("bad", "good"):
            backend.send(StageMessage(rid, {"waveform": torch.zeros(1600)}, TurnRequest(), last=True))
        assert done.wait(120)
    finally:
        backend.stop()
    (err,) = [m for m in outputs if isinstance(m.meta, StageError)]
    assert err.request_id == "bad" and err.meta.stage == "llm" and err.meta.error.startswith("llm: ")
    assert "AudioOutput" in err.meta.error and "DecoderOutput" in err.meta.error
    assert [type(m.meta) for m in outputs if m.request_id == "bad"] == [Transcript, StageError]
    good = [m for m in outputs if m.request_id == "good" and isinstance(m.meta, AudioOutput)]
    assert good[-1].last and sum(m.tensors["pcm"].numel() for m in good) > 0


class _Control:
    """The control socket's ``send_string`` (the stage processes' ``abort`` commands), recorded."""

    def __init__(self):
        self.sent = []

    def send_string(self, s):
        self.sent.append(s)


def test_a_stage_message_that_does_not_fit_fails_its_turn_only_across_processes():
    """What a stage process sends the orchestrator is read back as its kind (``unpack``): a meta that does
    not fit fails that turn, naming the stage and the field, and the other turn's message is delivered."""
    backend = ProcessBackend(PipelineConfig(model=str(default_model())))  # not started: no stage process
    outputs = []
    backend.on_output, backend.control = outputs.append, _Control()
    try:
        for rid, name in ((1, "bad"), (2, "good")):
            backend.ids[name], backend.names[rid] = rid, name
            backend.inflight.add(rid)
            backend.waiting[rid] = {"llm", "tts"}
        token = torch.tensor([5])
        bad = {"token": token, META_KEY: torch.frombuffer(bytearray(b'DecoderOutput\0{"text": 5}'),
                                                         dtype=torch.uint8)}  # fmt: skip
        good = pack(StageMessage("2", {"token": token}, DecoderOutput(text="hi"), last=False), ("llm", "tts"),
                    CASCADE)  # fmt: skip
        backend._deliver("llm", SimpleNamespace(request_id=1, tensors=bad, last=False))
        backend._deliver("llm", SimpleNamespace(request_id=2, tensors=good, last=False))
    finally:
        os.close(backend._wake_r)
        os.close(backend._wake_w)
        shutil.rmtree(backend.run_dir, ignore_errors=True)
    err, ok = outputs
    assert err.request_id == "bad" and err.last and isinstance(err.meta, StageError)
    assert err.meta.stage == "llm" and err.meta.error.startswith("llm: ")
    assert "DecoderOutput: text" in err.meta.error
    assert ok.request_id == "good" and ok.meta == DecoderOutput(text="hi")
    assert torch.equal(ok.tensors["token"], token)
    assert backend.control.sent == ["abort 1"] and backend.inflight == {2}  # the bad turn aborted everywhere
