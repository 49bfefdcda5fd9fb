"""``omniduplex agent``: the command, the worker's entrypoint registration, which model the environment
selects, and credentials checked before the worker starts (missing or rejected → one clear line, exit 2),
against a stand-in for livekit-server's Twirp API that verifies the request's token like the server does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("livekit.agents")

import uvicorn  # noqa: E402
from fastapi import FastAPI, Request, Response  # noqa: E402
from livekit import api  # noqa: E402

from omniduplex.app.surfaces.livekit import worker  # noqa: E402
from omniduplex.app.surfaces.livekit.local_model import PipelineRealtimeModel  # noqa: E402
from omniduplex.app.surfaces.livekit.remote import RemoteRealtimeModel  # noqa: E402

KEY, SECRET = "omniduplex", "a-secret-of-at-least-32-characters-long"
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "OMNIDUPLEX_"))}


def agent(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "from omniduplex.cli.main import main; main()", "agent", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**CLEAN_ENV, **(env or {})})


@pytest.fixture(scope="module")
def livekit_api():
    """``/twirp/livekit.RoomService/ListRooms`` answering as livekit-server: 200 for a token signed with
    ``KEY``/``SECRET``, 401 ``unauthenticated`` otherwise."""
    app = FastAPI()

    @app.post("/twirp/livekit.RoomService/ListRooms")
    async def list_rooms(request: Request):
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        try:
            api.TokenVerifier(KEY, SECRET).verify(token)
        except Exception:
            return Response(
                '{"code":"unauthenticated","msg":"invalid token"}', 401, media_type="application/json"
            )
        return Response(api.ListRoomsResponse().SerializeToString(), media_type="application/protobuf")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_agent_help_names_livekit_commands():
    out = agent("--help")
    assert out.returncode == 0, out.stderr
    assert "start, dev, console" in out.stdout and "--realtime-url" in out.stdout
    sub = agent("start", "--help")  # livekit-agents' own CLI answers for its commands
    assert sub.returncode == 0 and "LIVEKIT_URL" in sub.stdout


def test_entrypoint_registers_and_agent_name_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("LIVEKIT_AGENT_NAME", "omniduplex")
    server = worker.make_server()
    assert server._entrypoint_fnc is worker.entrypoint
    assert server._agent_name == "omniduplex"  # explicit dispatch by this name (SIP dispatch rule)


def test_the_environment_selects_remote_or_in_process(monkeypatch):
    monkeypatch.setenv("OMNIDUPLEX_REALTIME_URL", "ws://omniduplex:8000/v1/realtime")
    monkeypatch.setenv("OMNIDUPLEX_API_KEY", "k1")
    remote = worker.build_model()
    assert isinstance(remote, RemoteRealtimeModel) and remote.options.api_key == "k1"
    monkeypatch.delenv("OMNIDUPLEX_REALTIME_URL")
    monkeypatch.setenv("OMNIDUPLEX_MODEL", "tiny")
    local = worker.build_model()
    assert isinstance(local, PipelineRealtimeModel) and local.options.model == "tiny"
    caps = local.capabilities
    assert caps.turn_detection and caps.message_truncation and caps.audio_output and caps.mutable_chat_context
    assert not (caps.manual_function_calls or caps.can_disable_turn_detection or caps.supports_say)


def test_missing_credentials_one_line():
    out = agent("start")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: set LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET "
        "(the LiveKit server URL and an API key pair of its keys)"
    ]


def test_wrong_credentials_one_line(livekit_api):
    env = {"LIVEKIT_URL": livekit_api, "LIVEKIT_API_KEY": KEY, "LIVEKIT_API_SECRET": "not-the-secret-" * 3}
    out = agent("start", env=env)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert (
        line.startswith(f"error: LiveKit at {livekit_api} rejected LIVEKIT_API_KEY='{KEY}'") and "401" in line
    )


def test_right_credentials_pass_the_check(livekit_api, monkeypatch):
    for k, v in {"LIVEKIT_URL": livekit_api, "LIVEKIT_API_KEY": KEY, "LIVEKIT_API_SECRET": SECRET}.items():
        monkeypatch.setenv(k, v)
    assert worker.preflight(["start"]) is None
    assert worker.preflight(["console"]) is None  # local: no server needed
    assert worker.preflight(["start", "--api-secret", "wrong" * 8]) is not None  # flags override the env
