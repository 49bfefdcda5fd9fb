"""Typed edge messages: each kind's keys and types, the same keys on the wire, and the debug-mode check."""

import threading

import pytest
import torch

from omniduplex.pipeline import edge_messages as em
from omniduplex.pipeline.messages import StageMessage
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.stages.contract import BatchGauges
from omniduplex.pipeline.topology import CASCADE


def test_kind_keeps_the_wire_keys_and_the_turn_options():
    meta = {
        "transcript": "hi",
        "words": [["hi", 0.0, 0.2]],
        "asr_ms": 12.5,
        "history": [["user", "a"]],
        "system_prompt": "be brief",
        "metadata": {"k": 1},
    }
    t = em.parse(em.Transcript, StageMessage("r", meta=meta))
    assert t.transcript == "hi" and t.asr_ms == 12.5 and t.turn.system_prompt == "be brief"
    assert t.to_meta() == meta  # the session's own keys travel untouched


@pytest.mark.parametrize(
    ("stage", "meta", "bad"),
    [
        ("asr", {"transcript": 3}, "transcript"),
        ("llm", {"text": "x", "tool_call_done": {"call_id": "c", "name": "f"}}, "arguments"),
        ("tts", {"text": "x", "tts_ms": "slow"}, "tts_ms"),
        ("asr", {"transcript": "x", "history": "not a list"}, "history"),
        ("orchestrator", {"asr_piece": True, "prefill": {"history": []}}, "system_prompt"),
    ],
)
def test_a_key_of_the_wrong_type_is_named(stage, meta, bad):
    with pytest.raises(em.EdgeMessageError, match=bad):
        em.check_message(stage, StageMessage("r", meta=meta))


def test_message_kind_by_producer():
    partial = StageMessage("r", meta={"partial_transcript": "he"})
    assert em.output_kind("asr", partial) is em.PartialTranscript
    assert em.output_kind("asr", StageMessage("r", meta={"transcript": "hello"}, last=True)) is em.Transcript
    assert em.output_kind("orchestrator", StageMessage("r", meta={"text": "say"})) is em.SpeechRequest
    assert em.output_kind("orchestrator", StageMessage("r", meta={"history": []})) is em.TurnRequest
    assert set(em.OUTPUT_KINDS) | {"orchestrator"} >= {"asr", "llm", "tts", "encoder", "code2wav"}


class _Worker(BatchGauges):
    """Answers each message at once with ``meta`` (a stage that may send a bad message)."""

    max_batch = 8

    def __init__(self, meta):
        self.pending, self.meta = [], meta

    def submit(self, msg):
        self.pending.append(msg)

    def abort(self, request_id):
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self):
        return bool(self.pending)

    def step(self):
        out, self.pending = self.pending, []
        return [
            StageMessage(m.request_id, {"token": torch.zeros(0, dtype=torch.int64)}, dict(self.meta), True)
            for m in out
        ]


def test_debug_mode_fails_the_turn_of_a_bad_message_at_the_edge():
    errors, done = [], threading.Event()

    def on_output(source, msg):
        if source == "error":
            errors.append(msg.meta["error"])
            done.set()

    workers = {"asr": _Worker({"transcript": "hi"}), "llm": _Worker({"text": 5}), "tts": _Worker({})}
    backend = LocalBackend(workers, CASCADE)
    backend.start(on_output)
    try:
        backend.send(StageMessage("t1", {"waveform": torch.zeros(160)}, last=True))
        assert done.wait(60)
    finally:
        backend.stop()
    # the ASR's transcript passed; the LLM's text of the wrong type failed the turn, naming stage and key
    assert len(errors) == 1 and errors[0].startswith("llm: ") and "text" in errors[0]
