"""The voice chat page in real headless Chromium (Debian's ``chromium``), driven by Playwright.

Chromium's fake microphone loops a WAV made at test time with espeak-ng + sox: a question, 3 s of
silence (endpointing commits the turn, the reply starts playing), then a second sentence spoken over
the reply (barge-in), then silence. Asserts that the server committed a user turn from the browser's
audio, that the browser received reply audio (inbound RTP bytes, a non-zero analyser level), and that
speech during playback triggered a barge-in that stopped the reply (the page's reply level fell to
silence after it). Measured times are printed and written with a screenshot to ``artifacts/``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import LocalServer, free_port  # noqa: F401 (free_port: kiosk tests)
from omniduplex.models.qwen3_omni.presets import write_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]
STATE_JS = """() => ({
  connected: omni.connected,
  events: omni.events.filter((e) => e.type !== "reply_text"),
  inboundBytes: omni.inboundBytes, inboundPackets: omni.inboundPackets,
  replyLevelMax: omni.replyLevelMax, latencyMs: omni.latencyMs,
  stopMs: omni.stopMs, heardStopMs: omni.heardStopMs, jitterBufferMs: omni.jitterBufferMs,
  errors: omni.errors,
})"""


def say(text: str, out: Path) -> Path:
    raw = out.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", "48000", "-c", "1", "-b", "16", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory) -> Path:
    """question · 3 s silence · interruption · 2 s silence, 48 kHz mono 16-bit."""
    d = tmp_path_factory.mktemp("speech")
    q = say("Hello there. Can you tell me what time it is?", d / "q.wav")
    b = say("Wait, stop. I have another question.", d / "b.wav")
    out = d / "speech.wav"
    subprocess.run(
        f"sox {q} -p pad 0 3 | sox - {b} -p | sox - {out} pad 0 2",
        shell=True,
        check=True,
        executable="/bin/bash",
    )
    return out




@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``omniduplex serve`` in a thread (in-process pipeline, tiny checkpoint) on a free loopback port."""
    ckpt = write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=1)
    cfg = ServerConfig(
        max_sessions=4, model=str(ckpt), processes=True, talker_max_tokens=100, ignore_eos=True
    )
    with LocalServer(create_app(cfg), start_timeout_s=120) as srv:
        yield srv.url(), srv.state


def wait_until(page, js: str, timeout_s: float, what: str) -> None:
    try:
        page.wait_for_function(js, timeout=timeout_s * 1000, polling=100)
    except Exception as e:
        state = page.evaluate(STATE_JS)
        raise AssertionError(
            f"{what} not seen within {timeout_s} s; page state: {json.dumps(state)[:2000]}"
        ) from e


def test_browser_turn_reply_and_barge_in(server, speech_wav):
    from playwright.sync_api import sync_playwright

    url, state = server
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={speech_wav}"],
            timeout=60_000,
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{url}/?raw=1")
            page.click("#connect")
            wait_until(page, "() => omni.connected", 20, "ICE/DTLS connection")
            has = "(t) => omni.events.some((e) => e.type === t)"
            wait_until(page, f"() => ({has})('user_turn_committed')", 40, "a committed user turn")
            wait_until(
                page,
                f"() => ({has})('reply_audio_started') && omni.inboundBytes > 0 && omni.replyLevelMax > 0",
                40,
                "reply audio in the browser",
            )
            wait_until(
                page,
                "() => omni.events.some((e) => e.type === 'reply_ended' && e.reason === 'interrupted'"
                " && e.played_ms > 0)",
                60,
                "a barge-in that ends the reply",
            )
            wait_until(page, "() => omni.heardStopMs.length > 0", 10, "the reply level falling silent")
            page.screenshot(path=str(ARTIFACTS / "e2e-voice-chat.png"), full_page=True)
            seen = page.evaluate(STATE_JS)
            server_metrics = state.metrics()
            page.click("#disconnect")
            deadline = time.monotonic() + 15
            while state.sessions and time.monotonic() < deadline:
                time.sleep(0.1)
            sessions_after = len(state.sessions)
        finally:
            browser.close()

    events = seen["events"]
    committed = next(e for e in events if e["type"] == "user_turn_committed")
    assert committed["speech_ms"] >= 200 and committed["audio_ms"] > committed["speech_ms"]
    assert seen["inboundBytes"] > 0 and seen["inboundPackets"] > 0 and seen["replyLevelMax"] > 0
    ended = next(
        e for e in events if e["type"] == "reply_ended" and e["reason"] == "interrupted" and e["played_ms"]
    )
    barge = next(e for e in events if e["type"] == "barge_in" and e["turn_id"] == ended["turn_id"])
    assert events.index(barge) < events.index(ended) and ended["stop_ms"] is not None
    assert ended["text"].startswith(ended["kept_text"]) and len(ended["kept_text"]) <= len(ended["text"])
    assert server_metrics["turns"] >= 1 and server_metrics["barge_ins"] >= 1
    assert sessions_after == 0
    assert not seen["errors"]

    report = {
        "speech_end_to_first_audio_ms": seen["latencyMs"],
        "barge_in_stop_ms_server": seen["stopMs"],
        "barge_in_stop_ms_heard_in_browser": seen["heardStopMs"],
        "browser_jitter_buffer_ms": seen["jitterBufferMs"],
        "played_ms_before_barge_in": ended["played_ms"],
        "inbound_bytes": seen["inboundBytes"],
    }
    (ARTIFACTS / "e2e-voice-chat.json").write_text(json.dumps(report, indent=2))
    print("\n" + json.dumps(report))
