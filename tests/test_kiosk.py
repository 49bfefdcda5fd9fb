"""The kiosk's server side without a browser: settings (YAML, flags, colour contrast), its HTTP routes, the
``greet`` data-channel message, the Chromium command line. The page: tests/e2e/test_kiosk_browser.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from session_harness import ScriptedResponder
from typer.testing import CliRunner

from omniduplex.app.core.greeting import greeting_instructions
from omniduplex.app.core.replies import ReplyDone
from omniduplex.app.core.session import SessionConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.server import kiosk_server_config as server_config
from omniduplex.app.surfaces.browser.webrtc import PeerSession
from omniduplex.app.surfaces.kiosk.config import (
    KioskColors,
    KioskConfig,
    chromium_command,
    contrast_ratio,
    kiosk_url,
    load_kiosk_config,
    page_config,
)
from omniduplex.cli.main import cli


def test_contrast_ratio_matches_wcag():
    assert contrast_ratio("#000", "#ffffff") == pytest.approx(21.0)
    assert contrast_ratio("#777777", "#777") == pytest.approx(1.0)
    assert contrast_ratio("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)  # the classic AA grey
    with pytest.raises(ValueError, match="#rgb"):
        contrast_ratio("red", "#fff")


def test_defaults_are_legible_and_low_contrast_is_refused():
    c = KioskConfig().colors
    assert contrast_ratio(c.text, c.background) >= 4.5 and contrast_ratio(c.text, c.surface) >= 4.5
    with pytest.raises(ValueError, match=r"text #888888 on surface #777777 has contrast 1\.\d+:1"):
        KioskConfig(colors=KioskColors(surface="#777777", text="#888888", background="#000000"))
    with pytest.raises(ValueError, match="accent"):
        KioskConfig(colors={"accent": "#101010"})


def test_yaml_section_then_flags(tmp_path):
    f = tmp_path / "server.yaml"
    f.write_text(
        "other: {ignored: true}\n"
        "kiosk:\n"
        "  title: Ask the museum\n"
        "  greeting: Welcome!\n"
        "  system_prompt: You are a museum guide.\n"
        "  turn_detection: smart\n"
        "  idle_timeout_s: 45\n"
        "  colors: {background: '#ffffff', surface: '#f1f5f9', text: '#111827', accent: '#0f766e'}\n"
    )
    cfg = load_kiosk_config(f, title="Flag title", idle_timeout_s=None)
    assert cfg.title == "Flag title" and cfg.greeting == "Welcome!" and cfg.idle_timeout_s == 45
    assert cfg.turn_detection == "smart" and cfg.colors.background == "#ffffff"
    page = page_config(cfg)
    assert "system_prompt" not in page and "voice" not in page and page["colors"]["text"] == "#111827"
    assert load_kiosk_config(None) == KioskConfig()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("kiosk:\n  titel: x\n", "unknown key(s) titel"),
        ("kiosk:\n  colors: {fg: '#fff'}\n", "kiosk.colors: unknown key(s) fg"),
        ("kiosk:\n  turn_detection: vad\n", "'silence' or 'smart'"),
        ("kiosk:\n  idle_timeout_s: 0\n", "idle_timeout_s must be > 0"),
        ("kiosk: [1]\n", "'kiosk' must be a mapping"),
        ("kiosk: {\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_problem(tmp_path, text, error):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ValueError) as e:
        load_kiosk_config(f)
    assert error in str(e.value)


def test_server_config_applies_prompt_voice_and_turn_detection():
    k = KioskConfig(system_prompt="Be a guide.", voice="joe", turn_detection="smart")
    cfg = server_config(k, max_sessions=3)
    assert cfg.max_sessions == 3 and cfg.kiosk is k and cfg.system_prompt == "Be a guide."
    assert cfg.speaker == "joe" and cfg.session.turn.turn_detection == "smart"
    assert server_config(KioskConfig()).speaker == ServerConfig().speaker


def test_chromium_command_line():
    url = kiosk_url("0.0.0.0", 8000)
    assert url == "http://127.0.0.1:8000/kiosk"
    cmd = chromium_command(url)
    assert cmd[0] == "chromium" and cmd[-1] == url
    assert {"--kiosk", "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream"} <= set(
        cmd
    )
    assert not any(c.startswith("--unsafely-treat") for c in cmd)
    remote = chromium_command("http://10.0.0.5:8000/kiosk")
    assert "--unsafely-treat-insecure-origin-as-secure=http://10.0.0.5:8000" in remote


class Idle:
    output_rate = 24000

    def start(self, *a, **k):
        raise AssertionError("no turn expected")

    async def events(self, turn_id):
        if False:
            yield

    def cancel(self, turn_id):
        pass


def test_routes_serve_the_page_and_its_settings():
    async def main():
        cfg = ServerConfig(kiosk=KioskConfig(title="Hall A", push_to_talk=True, system_prompt="secret"))
        app = create_app(cfg, responder=Idle())
        async with app.router.lifespan_context(app):
            t = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=t, base_url="http://test") as c:
                return (
                    await c.get("/kiosk"),
                    await c.get("/kiosk/config.json"),
                    await c.get("/kiosk/"),
                    await c.get("/kiosk.js"),
                )

    page, conf, slash, js = asyncio.run(main())
    assert page.status_code == 200 and "kiosk.js" in page.text and 'aria-live="polite"' in page.text
    assert conf.json()["title"] == "Hall A" and conf.json()["push_to_talk"] is True
    assert "secret" not in conf.text and conf.headers["cache-control"] == "no-cache"
    assert slash.status_code == 308 and slash.headers["location"] == "/kiosk"
    assert js.status_code == 200


def test_greet_message_speaks_the_configured_greeting():
    async def main():
        responder = ScriptedResponder()

        async def closed(_):
            pass

        peer = PeerSession("k1", responder, SessionConfig(), closed)
        peer.greeting = "Welcome to Hall A!"
        peer._on_message(json.dumps({"type": "greet"}))
        (turn_id, wav, history) = responder.started[0]
        options = responder.options[turn_id]
        peer._on_message(json.dumps({"type": "greet"}))  # a reply is in flight: not a second greeting
        responder.feed(turn_id, ReplyDone({}))
        await asyncio.sleep(0)
        await peer.close("test")
        return wav, options, len(responder.started)

    wav, options, n = asyncio.run(main())
    assert wav.size == 0 and options["user_text"] == "Hello!" and n == 1
    assert options["instructions"] == greeting_instructions("Welcome to Hall A!")
    assert options["metadata"] == {"kiosk": "greeting"}


def test_kiosk_command_reports_a_bad_config(tmp_path):
    f = tmp_path / "k.yaml"
    f.write_text("kiosk:\n  colors: {text: '#161d36'}\n")
    r = CliRunner().invoke(cli, ["kiosk", "--config", str(f)])
    assert r.exit_code == 2 and "contrast" in r.output


def test_kiosk_command_refuses_a_public_address_without_keys(monkeypatch):
    monkeypatch.delenv("OMNIDUPLEX_API_KEYS", raising=False)
    r = CliRunner().invoke(cli, ["kiosk", "--host", "0.0.0.0"])
    assert r.exit_code == 2 and "error:" in r.output
