"""``WS /v1/audio/speech/stream`` (app/surfaces/rest/speech_stream.py) against the real app on uvicorn, with a
real WebSocket client (``websockets``), on the packaged Piper voice and a tiny Qwen3-TTS checkpoint: audio of
a clause arrives before the text is complete, flush speaks a partial clause, cancel stops the audio, bad
messages get an ``error`` and the socket goes on, a client that vanishes frees its requests, and the upgrade
is authenticated."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time

import numpy as np
import pytest
import websockets
from test_server import IdleResponder

from omniduplex.app.host.auth import AuthConfig
from omniduplex.app.host.speech.piper import packaged_piper
from omniduplex.app.host.speech.qwen3 import Qwen3Speech
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint

pytestmark = pytest.mark.slow
WAIT_S = 300  # a bound on every wait for the server (a loaded 2-core machine), never a timing assertion


@pytest.fixture(scope="module", params=["piper", "qwen3"])
def server(request, tmp_path_factory):
    """``(LocalServer, service)``: the app on a loopback port with the service behind its speech routes."""
    if request.param == "piper":
        svc = packaged_piper()
    else:
        path = write_tts_checkpoint(tmp_path_factory.mktemp("q3") / "cv", "tiny", 0, "custom_voice")
        svc = Qwen3Speech(path, max_num_seqs=4, max_frames=12, context=160, sampling={"temperature": 0.0})
    app = create_app(ServerConfig(max_sessions=2), responder=IdleResponder())
    app.state.server.speech = svc
    with LocalServer(app) as srv:
        yield srv, svc
    if request.param == "qwen3":
        svc.close()


class Client:
    """A ``/v1/audio/speech/stream`` client that records every server message in order: ``("audio", bytes)``
    for binary frames, ``(type, event)`` for JSON events."""

    def __init__(self, ws) -> None:
        self.ws, self.got = ws, []

    async def send(self, **msg) -> None:
        await self.ws.send(json.dumps(msg))

    async def until(self, pred) -> list:
        """Receive until ``pred(kind, payload)`` holds for a message; return the messages received so far."""
        while True:
            raw = await asyncio.wait_for(self.ws.recv(), WAIT_S)
            item = ("audio", raw) if isinstance(raw, bytes) else (json.loads(raw)["type"], json.loads(raw))
            self.got.append(item)
            if pred(*item):
                return self.got


def run_client(srv: LocalServer, body, path: str = "/v1/audio/speech/stream", **connect_kw):
    async def main():
        async with websockets.connect(srv.url(path, "ws"), open_timeout=WAIT_S, **connect_kw) as ws:
            c = Client(ws)
            await c.until(lambda k, _: k == "session.created")
            await c.send(type="session.update", voice="aiden")  # a CustomVoice speaker; Piper ignores it
            return await body(c)

    return asyncio.run(main())


def is_type(kind):
    return lambda k, _: k == kind


def clause_audio(got: list) -> dict[int, bytes]:
    """Binary audio per clause: frames belong to the last ``clause.created`` not yet done (clauses are spoken
    one at a time, in order)."""
    out, created, done = {}, [], set()
    for kind, ev in got:
        if kind == "clause.created":
            created.append(ev["clause"])
        elif kind in ("clause.done", "error") and isinstance(ev, dict) and "clause" in ev:
            done.add(ev["clause"])
        elif kind == "audio":
            cid = next(c for c in created if c not in done)
            out[cid] = out.get(cid, b"") + ev
    return out


def test_audio_of_a_clause_arrives_before_the_text_is_complete(server):
    srv, svc = server
    parts = ["Boil the water in a kettle, ", "then pour it over the tea leaves. ", "Wait for three minutes."]

    async def body(c):
        await c.send(type="text", text=parts[0])
        await c.until(is_type("audio"))  # the first clause speaks: the rest is not sent yet
        for p in parts[1:]:
            await c.send(type="text", text=p)
        await c.send(type="end")
        await c.until(is_type("done"))
        return c.got

    got = run_client(srv, body)
    created = [ev for k, ev in got if k == "clause.created"]
    assert [ev["text"] for ev in created] == [p.strip() for p in parts]
    first_audio = next(i for i, (k, _) in enumerate(got) if k == "audio")
    assert [ev["clause"] for k, ev in got[:first_audio] if k == "clause.created"] == [0]
    done = {ev["clause"]: ev["samples"] for k, ev in got if k == "clause.done"}
    audio = clause_audio(got)
    assert sorted(done) == [0, 1, 2] and all(done[c] > 0 and len(audio[c]) == 2 * done[c] for c in done)
    if isinstance(svc, Qwen3Speech):  # greedy: each clause's audio is that clause spoken alone
        for ev in created:
            want = asyncio.run(_speak(svc, ev["text"]))
            assert audio[ev["clause"]] == want
    assert got[-1][0] == "done"


async def _speak(svc, text: str) -> bytes:
    pieces = [p async for p in svc.stream(svc.prompt(text, "aiden"))]
    return (np.clip(np.concatenate(pieces), -1, 1) * 32767).astype("<i2").tobytes()


def test_flush_speaks_a_partial_clause_and_base64_framing(server):
    srv, _ = server

    async def body(c):
        await c.send(type="text", text="Hello there my good")
        await c.send(type="text", text=" friend")
        await c.send(type="flush")
        await c.until(is_type("clause.done"))
        await c.send(type="end")
        return await c.until(is_type("done"))

    got = run_client(srv, body, "/v1/audio/speech/stream?format=base64")
    created = [ev for k, ev in got if k == "clause.created"]
    assert [ev["text"] for ev in created] == ["Hello there my good friend"]
    audio = [ev for k, ev in got if k == "audio"]
    assert audio and all(ev["clause"] == 0 for ev in audio)
    assert not any(isinstance(ev, bytes) for _, ev in got)
    done = next(ev for k, ev in got if k == "clause.done")
    assert sum(len(base64.b64decode(ev["audio"])) for ev in audio) == 2 * done["samples"] > 0


def test_cancel_stops_the_audio_and_the_socket_goes_on(server):
    srv, _ = server
    text = " ".join(f"Clause number {w} is here," for w in ("one", "two", "three", "four", "five", "six"))

    async def body(c):
        await c.send(type="text", text=text + " ")
        await c.until(is_type("audio"))
        await c.send(type="cancel")
        await c.until(is_type("cancelled"))
        mark = len(c.got)
        await c.send(type="text", text="A fresh start.")
        await c.send(type="end")
        await c.until(is_type("done"))
        return c.got, mark

    got, mark = run_client(srv, body)
    before, after = got[:mark], got[mark:]
    cancelled = before[-1][1]["clauses"]
    created = [ev["clause"] for k, ev in before if k == "clause.created"]
    done = [ev["clause"] for k, ev in before if k == "clause.done"]
    assert len(created) >= 5 and cancelled and set(done) | set(cancelled) == set(created)
    assert not set(done) & set(cancelled) and len(done) < len(created)
    assert after[0][0] == "clause.created" and after[0][1]["text"] == "A fresh start."
    assert after[0][1]["clause"] == max(created) + 1  # no audio between ``cancelled`` and the new clause
    assert [k for k, _ in after if k not in ("audio",)] == ["clause.created", "clause.done", "done"]


def test_bad_messages_get_an_error_and_the_socket_stays_usable(server):
    srv, svc = server

    async def body(c):
        await c.ws.send("{not json")
        await c.until(is_type("error"))
        await c.send(type="speak", text="x")
        await c.until(is_type("error"))
        await c.send(type="text", text="x" * 5000)
        await c.until(is_type("error"))
        await c.send(type="text", text=7)
        await c.until(is_type("error"))
        await c.send(type="session.update", voice="alloy")
        await c.send(type="text", text="Hello there.")
        await c.send(type="flush")
        await c.until(lambda k, ev: k in ("clause.done", "error") and "clause" in ev)
        await c.send(type="session.update", voice="aiden")
        await c.send(type="text", text="Good morning.")
        await c.send(type="end")
        return await c.until(is_type("done"))

    got = run_client(srv, body)
    codes = [ev["error"]["code"] for k, ev in got if k == "error"]
    assert codes[:4] == ["invalid_json", "unknown_type", "text_too_long", "invalid_value"]
    clause_errors = [ev for k, ev in got if k == "error" and "clause" in ev]
    if isinstance(svc, Qwen3Speech):  # an unknown speaker refuses that clause only
        assert len(clause_errors) == 1 and clause_errors[0]["error"]["param"] == "voice"
        assert "alloy" in clause_errors[0]["error"]["message"]
    else:
        assert not clause_errors  # Piper has one voice and ignores the field
    done = [ev for k, ev in got if k == "clause.done"]
    assert done and done[-1]["samples"] > 0 and got[-1][0] == "done"


def test_a_vanished_client_frees_everything(server):
    srv, svc = server
    text = " ".join(f"Sentence {w} goes on and on." for w in ("one", "two", "three", "four", "five"))

    async def body(c):
        await c.send(type="text", text=text + " ")
        await c.until(is_type("audio"))
        c.ws.transport.abort()  # gone without a close frame

    with contextlib.suppress(websockets.ConnectionClosed):
        run_client(srv, body)

    def leftovers():
        tasks = asyncio.run_coroutine_threadsafe(_task_names(), srv.loop).result(WAIT_S)
        busy = isinstance(svc, Qwen3Speech) and (svc.engine.has_unfinished() or svc._incoming)
        return [n for n in tasks if n.startswith("speech-stream")] or busy

    deadline = time.monotonic() + WAIT_S
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not leftovers()


async def _task_names() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks()]


def test_the_upgrade_needs_a_key_when_keys_are_set(server):
    _, svc = server
    app = create_app(ServerConfig(auth=AuthConfig(api_keys={"sk-test"})), responder=IdleResponder())
    app.state.server.speech = svc
    with LocalServer(app) as srv:
        with pytest.raises(websockets.InvalidStatus) as e:
            run_client(srv, lambda c: None)
        assert e.value.response.status_code in (401, 403)

        async def body(c):
            await c.send(type="text", text="Hi.")
            await c.send(type="end")
            return await c.until(is_type("done"))

        got = run_client(srv, body, additional_headers={"Authorization": "Bearer sk-test"})
        assert [k for k, _ in got if k != "audio"][-2:] == ["clause.done", "done"]


def test_text_past_the_unspoken_limit_is_refused_until_cancel(server):
    srv, _ = server
    burst = "Go on now, " * 360  # 3960 characters, 360 short clauses: far more than is spoken meanwhile

    async def body(c):
        for _ in range(5):  # the 5th would put over 16384 characters in wait
            await c.send(type="text", text=burst)
        await c.until(is_type("error"))
        await c.send(type="cancel")
        await c.until(is_type("cancelled"))
        await c.send(type="text", text="Fine.")
        await c.send(type="end")
        return await c.until(is_type("done"))

    got = run_client(srv, body)
    errors = [ev["error"] for k, ev in got if k == "error"]
    assert [e["code"] for e in errors] == ["buffer_full"] and errors[0]["param"] == "text"
    created = [ev["clause"] for k, ev in got if k == "clause.created"]
    assert len(created) == 4 * 360 + 1  # the refused burst queued nothing
    assert [k for k, _ in got if k not in ("audio", "clause.created")][-2:] == ["clause.done", "done"]


def test_an_unknown_model_is_refused_with_one_error(server):
    """``?model=`` names a loaded speech model as ``POST /v1/audio/speech``'s ``model``; an unknown one gets
    one ``error`` naming the field and the socket closes."""
    srv, _ = server

    async def main():
        url = srv.url("/v1/audio/speech/stream?model=no-such-model", "ws")
        async with websockets.connect(url, open_timeout=WAIT_S) as ws:
            ev = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), WAIT_S)
            return ev

    ev = asyncio.run(main())
    assert ev["type"] == "error" and ev["error"]["param"] == "model", ev
    assert "no-such-model" in ev["error"]["message"]
