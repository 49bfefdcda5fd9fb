"""Authentication and limits at the edge: every entry point refuses a missing (401), wrong or expired (403)
credential when keys are configured; tokens minted with a key work until they expire; body size,
connection rate and per-key sessions are limited; a public bind needs keys or --insecure."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from test_server import IdleResponder

from omniduplex.app.host.auth import AuthConfig, AuthConfigError, check_bind, load_keys
from omniduplex.app.server import ServerConfig, create_app

KEY = "sk-test-key"
HTTP = [
    ("POST", "/offer"),
    ("GET", "/v1/models"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/audio/speech"),
    ("POST", "/v1/realtime/client_secrets"),
    ("GET", "/metrics"),
    ("GET", "/stats"),
    ("DELETE", "/sessions/s1"),
    ("POST", "/session-token"),
]
WEBSOCKETS = ["/v1/realtime", "/phone/twilio/stream"]


def app_with(**auth):
    cfg = ServerConfig(max_sessions=8, auth=AuthConfig(api_keys={KEY}, **auth))
    return create_app(cfg, responder=IdleResponder())


@pytest.fixture(scope="module")
def client():
    with TestClient(app_with()) as c:
        yield c


@pytest.mark.parametrize(("method", "path"), HTTP)
def test_http_entry_points_need_a_valid_key(client, method, path):
    assert client.request(method, path).status_code == 401
    assert client.request(method, path, headers={"Authorization": "Bearer wrong"}).status_code == 403
    ok = client.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code not in (401, 403)


@pytest.mark.parametrize("path", WEBSOCKETS)
def test_websocket_entry_points_are_refused_before_the_upgrade(client, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(WebSocketDisconnect) as e, client.websocket_connect(path, headers=headers):
            pass
        assert e.value.code == 1008


def test_realtime_accepts_the_key_in_a_header_or_the_browser_subprotocol(client):
    with client.websocket_connect("/v1/realtime", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert ws.receive_json()["type"] == "session.created"
    with client.websocket_connect(
        "/v1/realtime", subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]
    ) as ws:
        assert ws.receive_json()["type"] == "session.created"


def test_minted_tokens_work_until_they_expire(client, monkeypatch):
    token = client.post("/session-token", headers={"Authorization": f"Bearer {KEY}"}).json()["token"]
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert client.get(f"/v1/models?token={token}").status_code == 200
    secret = client.post(
        "/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"}, json={}
    ).json()["value"]
    with client.websocket_connect("/v1/realtime", headers={"Authorization": f"Bearer {secret}"}) as ws:
        assert ws.receive_json()["type"] == "session.created"
    import time as _time

    later = _time.time() + 3600
    monkeypatch.setattr("omniduplex.app.host.auth.time.time", lambda: later)
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {token}"}).status_code == 403


def test_pages_and_health_stay_open_and_twilio_needs_its_signature_token(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/").status_code == 200
    r = client.post("/phone/twilio/voice")
    assert r.status_code == 403 and "TWILIO_AUTH_TOKEN" in r.json()["error"]["message"]


def test_body_size_and_connection_rate_limits():
    with TestClient(app_with(max_body_bytes=1000, connections_per_minute=2)) as c:
        h = {"Authorization": f"Bearer {KEY}"}
        r = c.post("/v1/audio/speech", headers=h, content=b"x" * 2000)
        assert r.status_code == 413
        codes = [c.post("/offer", headers=h, json={}).status_code for _ in range(3)]
        assert codes[:2] == [400, 400] and codes[2] == 429  # the other endpoints go on
        assert c.get("/v1/models", headers=h).status_code == 200


def test_sessions_per_key():
    with TestClient(app_with(sessions_per_key=1)) as c:
        h = {"Authorization": f"Bearer {KEY}"}
        with c.websocket_connect("/v1/realtime", headers=h) as first:
            assert first.receive_json()["type"] == "session.created"
            with pytest.raises(WebSocketDisconnect) as e, c.websocket_connect("/v1/realtime", headers=h):
                pass
            assert "429" in e.value.reason
        with c.websocket_connect("/v1/realtime", headers=h) as again:  # the slot came back
            assert again.receive_json()["type"] == "session.created"


def test_public_bind_needs_keys_or_insecure(tmp_path, monkeypatch):
    none = AuthConfig()
    for host in ("127.0.0.1", "localhost", "::1"):
        check_bind(host, none, insecure=False)
    with pytest.raises(AuthConfigError, match="--insecure"):
        check_bind("0.0.0.0", none, insecure=False)
    check_bind("0.0.0.0", none, insecure=True)
    check_bind("0.0.0.0", AuthConfig(api_keys={"k"}), insecure=False)
    f = tmp_path / "keys"
    f.write_text("# ops\nk1\n\nk2  # ci\n")
    monkeypatch.setenv("OMNIDUPLEX_API_KEYS", "k3, k4")
    assert load_keys(["k0"], f) == {"k0", "k1", "k2", "k3", "k4"}
    with pytest.raises(AuthConfigError):
        load_keys(None, tmp_path / "missing")
