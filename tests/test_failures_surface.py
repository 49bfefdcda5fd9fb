"""A turn that fails inside a stage is never reported as success, on any surface, and the server goes on.

The pipeline here is the cascade's graph on the in-process :class:`LocalBackend` with small stand-in stages
(a typed-turn ASR, an LLM whose decode step raises while ``fail_next`` turns are left, a tone TTS): the
failure is a real exception in a real worker's ``step``, caught by the backend and carried as the turn's
``ReplyFailed(stage="llm")`` through the orchestrator and the session to each surface:

* ``POST /v1/chat/completions`` answers 500 (an SSE ``error`` chunk once the stream started) naming the
  stage and the exception; the next request succeeds;
* the Realtime API sends an ``error`` event and ``response.done`` with ``status: "failed"``; the next
  response on the same connection completes;
* a phone call (Twilio Media Streams) hears the spoken apology, and its next turn is answered;
* ``omniduplex_failed_turns_total{stage="llm"}`` counts each failed turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import websockets
from openai import AsyncOpenAI

from omniduplex.app.core.replies import OrchestratorResponder, ReplyDone, ReplyFailed
from omniduplex.app.core.session_config import FAILURE_APOLOGY, SessionConfig
from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.benchmarks.phone import TwilioCaller, phone_audio
from omniduplex.pipeline.messages import AudioOutput, DecoderOutput, StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.stages.contract import BatchGauges
from omniduplex.pipeline.topology import CASCADE

QUESTION_WAV = Path(__file__).parents[1] / "examples" / "question.wav"
BROKEN = "the decode step broke"
HEARD = "what is the weather"


def heard(m: StageMessage) -> str:
    """A typed turn's words, else :data:`HEARD`."""
    return m.meta.options.user_text or HEARD


class TypedASR(BatchGauges):
    """ASR stand-in: a typed turn's words (``user_text``), or :data:`HEARD` for spoken audio; the turn's
    options go on with the transcript, as the real ASR stage passes them."""

    max_batch = 8

    def __init__(self) -> None:
        self.pending: list[StageMessage] = []

    def submit(self, msg: StageMessage) -> None:
        if msg.last:  # pieces of a turn still being spoken are not transcribed here
            self.pending.append(msg)

    def abort(self, request_id: str) -> None:
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[StageMessage]:
        out, self.pending = self.pending, []
        return [
            StageMessage(m.request_id, {}, Transcript(turn=m.meta.turn, transcript=heard(m)), True)
            for m in out
        ]


class BreakingLLM(BatchGauges):
    """LLM stand-in whose decode step raises ``RuntimeError`` while ``fail_next`` turns are left to fail
    (words to say as written, ``say``, are passed on as the real stage does); otherwise it answers
    ``You said: <transcript>``."""

    max_batch = 8

    def __init__(self) -> None:
        self.pending: list[StageMessage] = []
        self.fail_next = 0

    def submit(self, msg: StageMessage) -> None:
        if msg.last:
            self.pending.append(msg)

    def abort(self, request_id: str) -> None:
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[StageMessage]:
        out, self.pending = self.pending, []
        if self.fail_next and any(m.meta.options.say is None for m in out):
            self.fail_next -= 1
            raise RuntimeError(BROKEN)
        token = {"token": torch.zeros(1, dtype=torch.int64)}
        texts = [(m.request_id, m.meta.options.say or f"You said: {m.meta.transcript}") for m in out]
        done = [(rid, DecoderOutput(text=text, finish_reason="stop")) for rid, text in texts]
        return [StageMessage(rid, token, meta, True) for rid, meta in done]


class ToneTTS(BatchGauges):
    """TTS stand-in: 0.4 s of a tone (24 kHz) per finished reply, with the words it speaks."""

    max_batch = 8

    def __init__(self) -> None:
        self.pending: list[StageMessage] = []

    def submit(self, msg: StageMessage) -> None:
        if msg.last:
            self.pending.append(msg)

    def abort(self, request_id: str) -> None:
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[StageMessage]:
        out, self.pending = self.pending, []
        pcm = torch.sin(torch.arange(9600) * 0.05).float() * 0.3
        return [StageMessage(m.request_id, {"pcm": pcm}, AudioOutput(text=m.meta.text), True) for m in out]


@pytest.fixture()
def served():
    """The app over the stand-in cascade on a free port; yields ``(server, llm)``. No preemptive replies:
    each spoken turn is one reply (a failed speculative start would be started again, unseen)."""
    llm = BreakingLLM()
    orch = Orchestrator(LocalBackend({"asr": TypedASR(), "llm": llm, "tts": ToneTTS()}, CASCADE), None,
                        output_rate=24000)
    session = SessionConfig(turn=TurnConfig(endpoint_ms=400, preemptive_ms=0))
    cfg = ServerConfig(session=session, processes=False)
    with LocalServer(create_app(cfg, OrchestratorResponder(orch))) as srv:
        asyncio.run_coroutine_threadsafe(orch.start(), srv.loop).result(30)
        try:
            yield srv, llm
        finally:
            asyncio.run_coroutine_threadsafe(orch.stop(), srv.loop).result(30)


def failed_turns(srv, stage: str) -> float:
    text = httpx.get(srv.url("/metrics"), timeout=10).text
    line = f'omniduplex_failed_turns_total{{stage="{stage}"}} '
    return next((float(x[len(line):]) for x in text.splitlines() if x.startswith(line)), 0.0)


def test_chat_completions_answers_500_naming_the_stage_then_serves(served):
    srv, llm = served
    url = srv.url("/v1/chat/completions")
    body = {"model": "omniduplex", "messages": [{"role": "user", "content": "hello"}]}
    llm.fail_next = 1
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "pipeline_error"
    assert "stage llm failed" in err["message"] and BROKEN in err["message"], err

    llm.fail_next = 1  # streamed: the error arrives as a chunk after the stream started, with no finish
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    last = json.loads(events[-1])
    assert "[DONE]" not in events and "stage llm failed" in last["error"]["message"], events
    assert not any(c["choices"][0].get("finish_reason") for c in map(json.loads, events[:-1]))

    r = httpx.post(url, json=body, timeout=60)  # the next request succeeds
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "You said: hello" and choice["finish_reason"] == "stop"
    assert failed_turns(srv, "llm") == 2


def test_realtime_sends_error_and_a_failed_response_then_serves(served):
    srv, llm = served

    async def respond(conn, text: str) -> list:
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await conn.conversation.item.create(item=item)
        await conn.response.create(response={"output_modalities": ["text"]})
        events = []
        async with asyncio.timeout(60):
            async for e in conn:
                events.append(e)
                if e.type == "response.done":
                    return events
        raise AssertionError("connection closed before response.done")

    async def main():
        client = AsyncOpenAI(base_url=srv.url("/v1"), api_key="sk-local", max_retries=0)
        async with client.realtime.connect(model="omniduplex") as conn:
            llm.fail_next = 1
            failed = await respond(conn, "hello")
            ok = await respond(conn, "hello again")
        return failed, ok

    failed, ok = asyncio.run(main())
    (error,) = [e for e in failed if e.type == "error"]
    assert error.error.code == "pipeline_error" and "llm" in error.error.message
    assert BROKEN in error.error.message
    done = failed[-1].response
    assert done.status == "failed" and BROKEN in done.status_details.error.message
    assert failed.index(error) < len(failed) - 1  # the error comes before response.done
    assert not any(e.type == "error" for e in ok)
    reply = ok[-1].response
    assert reply.status == "completed" and reply.output[0].content[0].text == "You said: hello again"
    assert failed_turns(srv, "llm") == 1


def test_a_phone_call_hears_the_apology_and_its_next_turn_is_answered(served):
    srv, llm = served
    question = phone_audio(QUESTION_WAV)

    async def turn(tw, session_of, n: int) -> list:
        tw.say(question)
        tw.say(np.zeros(8000, np.int16))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            session = session_of()
            if session is not None:
                said = [e for e in session.history.entries if e.role == "assistant"]
                if len(said) >= n and not session.busy:
                    return list(session.history.entries)
            await asyncio.sleep(0.05)
        raise AssertionError("no reply in time")

    async def main():
        async with websockets.connect(srv.url("/phone/twilio/stream", scheme="ws")) as ws:
            tw = TwilioCaller(ws)
            await tw.start()
            runner = asyncio.create_task(tw.run())

            def session_of():
                return next((c.session for c in srv.state.sessions.values()), None)

            llm.fail_next = 1
            first = await turn(tw, session_of, 1)
            heard_first = tw.received
            second = await turn(tw, session_of, 2)
            await tw.send({"event": "stop", "streamSid": tw.sid, "stop": {}})
            await asyncio.wait_for(runner, 10)
            return first, heard_first, second

    first, heard_first, second = asyncio.run(main())
    said = [e.text.strip() for e in first if e.role == "assistant"]
    assert said == [FAILURE_APOLOGY] and heard_first >= 0.3 * 8000  # the apology's tone reached the caller
    answers = [e.text.strip() for e in second if e.role == "assistant"]
    assert answers == [FAILURE_APOLOGY, f"You said: {HEARD}"]
    text = httpx.get(srv.url("/metrics"), timeout=10).text
    assert 'omniduplex_replies_total{reason="error"} 1.0' in text
    assert 'omniduplex_replies_total{reason="completed"} 1.0' in text
    assert failed_turns(srv, "llm") == 1


class GradTTS(ToneTTS):
    """TTS stand-in whose PCM still requires grad while ``bad_next`` replies are left: the orchestrator
    cannot read it (``Tensor.numpy()`` refuses), which must fail that turn, not the server."""

    bad_next = 1

    def step(self) -> list[StageMessage]:
        outs = super().step()
        if outs and self.bad_next:
            self.bad_next -= 1
            outs[0].tensors["pcm"] = outs[0].tensors["pcm"].clone().requires_grad_(True)
        return outs


def test_an_output_the_orchestrator_cannot_read_fails_only_its_turn():
    async def main():
        backend = LocalBackend({"asr": TypedASR(), "llm": BreakingLLM(), "tts": GradTTS()}, CASCADE)
        orch = Orchestrator(backend, None, output_rate=24000)
        await orch.start()
        try:
            turns = []
            for text in ("first", "second"):
                rid = orch.submit(np.zeros(0, np.float32), TurnOptions(user_text=text, history=[]))
                turns.append([ev async for ev in orch.events(rid)])
            return turns
        finally:
            await orch.stop()

    bad, good = asyncio.run(main())
    assert isinstance(bad[-1], ReplyFailed) and bad[-1].stage == "orchestrator"
    assert "AudioOutput" in bad[-1].error and "requires grad" in bad[-1].error, bad[-1]
    assert isinstance(good[-1], ReplyDone) and good[-2].pcm.size == 9600
