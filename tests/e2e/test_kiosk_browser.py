"""The kiosk (``/kiosk``) and the voice chat page's captions in real headless Chromium, with scripted replies.

The server is ``create_app`` with :class:`_kiosk_server.ScriptedReplies` (a known transcript, a known reply in
three clauses, each clause's audio carrying its words), so every run sees the same words at the same pace.
Chromium's fake microphone loops a WAV made at test time with espeak-ng + sox (a different one per test).
Screenshots of every state and screen go to ``artifacts/kiosk-*.png``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from _kiosk_server import GREETING, REPLY_CLAUSES, TITLE, USER_WORDS, kiosk_app
from test_browser_voice_chat import CHROMIUM, CHROMIUM_ARGS, free_port

from omniduplex.app.surfaces.kiosk.config import TEXT_CONTRAST, contrast_ratio
from omniduplex.benchmarks.local_server import LocalServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
ARTIFACTS = ROOT / "artifacts"
VIEWPORT = {"width": 1280, "height": 800}
REPLY = "".join(REPLY_CLAUSES).strip()
STATE_JS = """() => ({state: kiosk.state, log: kiosk.stateLog, link: kiosk.link, sessionId: kiosk.sessionId,
  attract: kiosk.attract, captions: kiosk.captionsText(), resets: kiosk.resets, greets: kiosk.greets,
  events: kiosk.events.filter((e) => e.type !== "reply_text")
    .map((e) => e.type + (e.reason ? ":" + e.reason : "")),
  micLevel: kiosk.micLevel, replyLevelMax: kiosk.replyLevelMax, heardStopMs: kiosk.heardStopMs})"""
HAS = "(t) => kiosk.events.some((e) => e.type === t)"


# -- speech and servers ---------------------------------------------------------------------------------
def sox(*args: str) -> None:
    subprocess.run(["sox", *args], check=True)


def say(text: str, out: Path) -> Path:
    """``text`` by espeak-ng at 48 kHz mono 16-bit (the fake microphone's format)."""
    raw = out.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True)
    sox(str(raw), "-r", "48000", "-c", "1", "-b", "16", str(out))
    return out


def silence(seconds: float, out: Path) -> Path:
    sox("-n", "-r", "48000", "-c", "1", "-b", "16", str(out), "trim", "0", str(seconds))
    return out


@pytest.fixture(scope="module")
def wavs(tmp_path_factory) -> dict[str, Path]:
    """The fake microphone's scripts (48 kHz mono); the device loops each one."""
    d = tmp_path_factory.mktemp("kiosk-speech")
    q = say("What can I see in the museum today?", d / "q.wav")
    cut = say("Wait, stop. Tell me about the dinosaurs instead.", d / "cut.wav")
    s = {n: silence(n, d / f"s{n}.wav") for n in (1, 2, 3, 6, 10, 12, 25)}

    def cat(name: str, *parts: Path) -> Path:
        out = d / f"{name}.wav"
        sox(*map(str, parts), str(out))
        return out

    return {
        "turn": cat("turn", s[3], q, s[12]),  # one question, then quiet
        "barge_in": cat("barge_in", s[3], q, s[2], cut, s[10]),  # speech over the reply
        "loop": cat("loop", s[1], q, s[1]),  # speech every ~3 s, for push-to-talk
        "restart": cat("restart", s[2], q, s[6]),  # a question every ~10 s
        "idle": cat("idle", s[2], q, s[25]),  # one question, then a long quiet
    }


def run_in_thread(app, port: int, start_timeout_s: float = 60):
    """uvicorn serving ``app`` on ``port`` in a daemon thread; returns ``(server, thread)`` once started."""
    srv = LocalServer(app, start_timeout_s, port).start()
    return srv.server, srv.thread


@pytest.fixture(scope="module")
def server():
    """The kiosk app with scripted replies, in a thread: ``(url, app state, responder)``."""
    app, responder = kiosk_app(max_sessions=8, media_timeout_s=3.0)
    port = free_port()
    srv, thread = run_in_thread(app, port)
    yield f"http://127.0.0.1:{port}", app.state.server, responder
    srv.should_exit = True
    thread.join(timeout=30)


def start_subprocess_server(port: int) -> subprocess.Popen:
    """``_kiosk_server.py`` in its own process, so that it can be killed for real; waits for /healthz."""
    import httpx

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "_kiosk_server.py"), str(port)], env=env
    )
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, "kiosk server process died"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "kiosk server process did not start"
        time.sleep(0.2)


# -- browser helpers --------------------------------------------------------------------------------------
@contextmanager
def chromium(mic_wav: Path, fake_ui: bool = True, fake_device: bool = True):
    """Headless Chromium with ``mic_wav`` as the microphone; ``fake_ui=False``: permission prompts are real
    (and headless denies them); ``fake_device=False``: no microphone at all. Yields the browser context."""
    from playwright.sync_api import sync_playwright

    drop = {"--use-fake-ui-for-media-stream"} if not fake_ui else set()
    if not fake_device:
        drop.add("--use-fake-device-for-media-stream")
    args = [a for a in CHROMIUM_ARGS if a not in drop]
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[*args, f"--use-file-for-fake-audio-capture={mic_wav}"],
            timeout=60_000,
        )
        try:
            context = browser.new_context(viewport=VIEWPORT)
            context.set_default_timeout(30_000)
            yield context
        finally:
            browser.close()


def wait_until(page, js: str, timeout_s: float, what: str, state_js: str = STATE_JS) -> None:
    try:
        page.wait_for_function(js, timeout=timeout_s * 1000, polling=50)
    except Exception as e:
        state = page.evaluate(state_js)
        raise AssertionError(f"{what} not seen within {timeout_s} s; page: {json.dumps(state)[:2500]}") from e


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"kiosk-{name}.png"))


def open_kiosk(context, url: str, query: str = ""):
    page = context.new_page()
    page.goto(f"{url}/kiosk?raw=1{query}")
    return page


def live(page, timeout_s: float = 20) -> None:
    wait_until(page, "() => kiosk.link && kiosk.link.phase === 'live'", timeout_s, "a live link")


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two computed ``rgb(r, g, b)`` colours."""

    def hex_of(rgb: str) -> str:
        return "#" + "".join(f"{int(x):02x}" for x in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3])

    return contrast_ratio(hex_of(fg), hex_of(bg))


# -- tests ------------------------------------------------------------------------------------------------
def test_one_turn_states_captions_and_screenshots(server, wavs):
    """idle → listening → thinking → speaking → listening, a screenshot of each; captions in step with the
    audio (the reply's text was all generated while the captions held only its first clause)."""
    url, _, _ = server
    with chromium(wavs["turn"]) as context:
        page = open_kiosk(context, url)
        live(page)
        assert page.evaluate("kiosk.state") == "idle" and page.title() == TITLE
        shot(page, "1-idle")
        wait_until(
            page, "() => kiosk.state === 'listening' && kiosk.micLevel > 0.05", 15, "listening to speech"
        )
        page.wait_for_timeout(300)  # let the visual swell with the voice
        shot(page, "2-listening")
        wait_until(page, "() => kiosk.state === 'thinking'", 15, "thinking")
        page.wait_for_timeout(400)
        shot(page, "3-thinking")
        first = REPLY_CLAUSES[0].strip()
        wait_until(
            page,
            f"() => kiosk.state === 'speaking' && kiosk.captionsText().includes({first!r})",
            15,
            "speech",
        )
        in_step = page.evaluate(
            "() => ({captions: kiosk.captionsText(),"
            " generated: kiosk.events.filter((e) => e.type === 'reply_text').map((e) => e.text).join('')})"
        )
        page.wait_for_timeout(500)
        shot(page, "4-speaking")
        wait_until(
            page,
            "() => kiosk.state === 'listening' && kiosk.stateLog.some((s) => s.state === 'speaking')",
            15,
            "listening after the reply",
        )
        shot(page, "5-listening-after-reply")
        seen = page.evaluate(STATE_JS)
        live_region = page.get_attribute("#captions", "aria-live")
        colours = page.evaluate(
            """() => [...document.querySelectorAll('#captions .cap .words, #captions .who, #state-label')]
              .map((el) => [getComputedStyle(el).color,
                getComputedStyle(el.closest('#captions') || document.body).backgroundColor])"""
        )

    # the generated text was all there while the captions held only what had been heard
    assert "ocean" in in_step["generated"] and "ocean" not in in_step["captions"], in_step
    assert [s["state"] for s in seen["log"]] == ["listening", "thinking", "speaking", "listening"], seen[
        "log"
    ]
    assert f"You: {USER_WORDS}" in seen["captions"] and f"Assistant: {REPLY}" in seen["captions"]
    assert "reply_ended:completed" in seen["events"] and seen["replyLevelMax"] > 0.01
    assert live_region == "polite"
    assert colours and all(contrast(fg, bg) >= TEXT_CONTRAST for fg, bg in colours), colours


def test_speaking_over_the_reply_interrupts_it_and_stops_the_audio(server, wavs):
    url, _, _ = server
    with chromium(wavs["barge_in"]) as context:
        page = open_kiosk(context, url)
        live(page)
        wait_until(page, f"() => ({HAS})('reply_audio_started')", 20, "the reply playing")
        wait_until(page, "() => kiosk.state === 'interrupted'", 15, "the interrupted state")
        page.wait_for_timeout(150)
        shot(page, "6-interrupted")
        wait_until(page, "() => kiosk.heardStopMs.length > 0", 5, "the reply audio falling silent")
        seen = page.evaluate(STATE_JS)
        cut_caption = page.evaluate(
            "() => document.querySelector('#captions .cap.assistant.interrupted')?.textContent"
        )
        stop_ms = page.evaluate("kiosk.heardStopMs[0]")
        ended = page.evaluate("() => kiosk.events.find((e) => e.type === 'reply_ended')")

    assert ended["reason"] == "interrupted" and 0 < ended["played_ms"] < 4000, ended
    assert seen["events"].index("barge_in") < seen["events"].index("reply_ended:interrupted")
    assert stop_ms < 1000, f"reply still audible {stop_ms:.0f} ms after the barge-in"
    assert cut_caption and "(interrupted)" in cut_caption and "ocean" not in cut_caption, cut_caption


def test_push_to_talk_commits_only_while_held(server, wavs):
    """The microphone loops speech; the server hears it (and commits turns) only while space is held."""
    url, _, _ = server
    count = "(t) => kiosk.events.filter((e) => e.type === t).length"
    with chromium(wavs["loop"]) as context:
        page = open_kiosk(context, url, "&ptt=1")
        live(page)
        session = page.evaluate("kiosk.sessionId")
        page.wait_for_timeout(4500)  # > media_timeout_s: a disabled track must still keep the session alive
        before = page.evaluate(STATE_JS)
        page.keyboard.down("Space")
        wait_until(page, "() => kiosk.pttHeld && kioskLink.mic.getAudioTracks()[0].enabled", 2, "the mic on")
        wait_until(page, "() => kiosk.state === 'listening' && kiosk.micLevel > 0.05", 8, "speech while held")
        page.wait_for_timeout(200)
        shot(page, "7-push-to-talk-held")
        wait_until(page, f"() => ({HAS})('user_turn_committed')", 12, "a turn committed while held")
        page.keyboard.up("Space")
        page.wait_for_timeout(300)
        starts_at_release = page.evaluate(f"({count})('user_speech_started')")
        page.wait_for_timeout(6000)  # two more loops of speech, not held
        after = page.evaluate(STATE_JS)
        starts_after = page.evaluate(f"({count})('user_speech_started')")
        enabled = page.evaluate("kioskLink.mic.getAudioTracks()[0].enabled")
        page.mouse.move(640, 300)
        page.mouse.down()  # touch and hold works the same way
        touch_on = page.evaluate("kioskLink.mic.getAudioTracks()[0].enabled")
        page.mouse.up()
        touch_off = page.evaluate("kioskLink.mic.getAudioTracks()[0].enabled")

    assert "user_speech_started" not in before["events"] and before["sessionId"] == session, before
    assert after["sessionId"] == session and "session_closed" not in after["events"]
    assert starts_after == starts_at_release >= 1, (starts_at_release, starts_after)
    assert not enabled and touch_on and not touch_off


def test_reconnects_by_itself_after_the_server_is_killed_and_restarted(wavs):
    port = free_port()
    proc = start_subprocess_server(port)
    try:
        with chromium(wavs["restart"]) as context:
            page = open_kiosk(context, f"http://127.0.0.1:{port}")
            live(page)
            first = page.evaluate("kiosk.sessionId")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            wait_until(
                page, "() => kiosk.link.phase !== 'live' && kiosk.link.problem === 'offline'", 15, "offline"
            )
            wait_until(page, "() => document.body.dataset.screen === 'problem'", 5, "the reconnecting screen")
            shot(page, "8-reconnecting")
            time.sleep(2)
            proc = start_subprocess_server(port)
            live(page, 40)
            second = page.evaluate("kiosk.sessionId")
            wait_until(
                page,
                f"() => kiosk.events.some((e) => e.type === 'reply_ended' && e.reason === 'completed'"
                f" && e.session_id === {second!r})",
                30,
                "a completed turn after reconnecting",
            )
            screen = page.evaluate("document.body.dataset.screen")
    finally:
        proc.kill()
        proc.wait(10)
    assert second != first and screen == "stage"


def test_idle_timeout_resets_captions_then_a_tap_greets(server, wavs):
    url, state, responder = server
    with chromium(wavs["idle"]) as context:
        page = open_kiosk(context, url, "&idle_timeout=3&attract_after=30")
        live(page)
        first = page.evaluate("kiosk.sessionId")
        wait_until(page, "() => kiosk.events.some((e) => e.type === 'reply_ended')", 20, "one turn")
        assert USER_WORDS in page.evaluate("kiosk.captionsText()")
        wait_until(page, "() => kiosk.resets === 1", 10, "the idle reset")
        assert page.evaluate("kiosk.captionsText()") == ""
        live(page)
        second = page.evaluate("kiosk.sessionId")
        wait_until(page, "() => document.body.dataset.screen === 'attract'", 2, "the attract screen")
        page.wait_for_timeout(300)
        shot(page, "9-attract")
        page.mouse.click(640, 400)
        wait_until(
            page, "() => kiosk.captionsText().includes('Welcome to the museum!')", 15, "the greeting spoken"
        )
        page.wait_for_timeout(400)
        shot(page, "10-greeting")
        seen = page.evaluate(STATE_JS)
        sessions = set(state.sessions)

    assert second != first and first not in sessions, "the old session (and its history) must be gone"
    assert seen["greets"] == 1 and not seen["attract"]
    greeting_turn = [o for _, audio_s, o in responder.started if audio_s == 0 and o.get("instructions")]
    assert greeting_turn and GREETING in greeting_turn[-1]["instructions"]
    assert USER_WORDS not in seen["captions"]


def test_denied_microphone_shows_the_permission_screen_and_recovers(server, wavs):
    url, _, _ = server
    with chromium(wavs["turn"], fake_ui=False) as context:
        page = open_kiosk(context, url)
        wait_until(page, "() => kiosk.link && kiosk.link.problem === 'denied'", 15, "the denied problem")
        wait_until(page, "() => document.body.dataset.screen === 'problem'", 2, "the problem screen")
        shot(page, "11-microphone-denied")
        title = page.text_content("#problem-title")
        context.grant_permissions(["microphone"], origin=url)
        live(page, 30)
        screen = page.evaluate("document.body.dataset.screen")
    assert "Microphone" in title and screen == "stage"


def test_no_microphone_shows_its_screen(server, wavs):
    url, _, _ = server
    with chromium(wavs["turn"], fake_device=False) as context:
        page = open_kiosk(context, url)
        wait_until(page, "() => kiosk.link && kiosk.link.problem === 'no-mic'", 15, "the no-mic problem")
        wait_until(page, "() => document.body.dataset.screen === 'problem'", 2, "the problem screen")
        shot(page, "13-no-microphone")
        title = page.text_content("#problem-title")
        attempts = page.evaluate("kiosk.link.attempt")
        page.wait_for_timeout(2000)
        retried = page.evaluate("kiosk.link.attempt") > attempts  # it keeps trying (a mic may be plugged in)
    assert title == "No microphone found" and retried


def test_server_full_shows_its_screen_and_recovers(server, wavs):
    url, state, _ = server
    saved = state.cfg.max_sessions
    state.cfg.max_sessions = 0  # every offer gets 503
    try:
        with chromium(wavs["turn"]) as context:
            page = open_kiosk(context, url)
            wait_until(
                page, "() => kiosk.link && kiosk.link.problem === 'full'", 15, "the server-full problem"
            )
            page.wait_for_timeout(200)
            shot(page, "12-server-full")
            state.cfg.max_sessions = saved
            live(page, 30)
    finally:
        state.cfg.max_sessions = saved


def test_a_server_with_api_keys_needs_the_key_in_the_url(wavs):
    app, _ = kiosk_app(api_keys=("kiosk-key-1",))
    port = free_port()
    srv, thread = run_in_thread(app, port)
    url = f"http://127.0.0.1:{port}"
    try:
        with chromium(wavs["turn"]) as context:
            page = open_kiosk(context, url)
            wait_until(page, "() => kiosk.link && kiosk.link.problem === 'auth'", 15, "the access problem")
            shot(page, "14-no-key")
            keyed = open_kiosk(context, url, "&token=kiosk-key-1")
            live(keyed)
            title = keyed.title()
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
    assert title == TITLE  # kiosk/config.json, behind the key, was read


def test_voice_chat_page_has_the_same_captions(server, wavs):
    url, _, _ = server
    omni_js = "() => ({captions: omni.captionsText(), events: omni.events.map((e) => e.type)})"
    with chromium(wavs["turn"]) as context:
        page = context.new_page()
        page.goto(f"{url}/?raw=1")
        page.click("#connect")
        first = REPLY_CLAUSES[0].strip()
        wait_until(page, f"() => omni.captionsText().includes({first!r})", 30, "the first clause", omni_js)
        early = page.evaluate("omni.captionsText()")
        wait_until(
            page, "() => omni.events.some((e) => e.type === 'reply_ended')", 15, "the reply end", omni_js
        )
        final = page.evaluate("omni.captionsText()")
        live_region = page.get_attribute("#captions", "aria-live")
        page.screenshot(path=str(ARTIFACTS / "voice-chat-captions.png"), full_page=True)
        page.click("#disconnect")
    assert "ocean" not in early
    assert f"You: {USER_WORDS}" in final and f"Assistant: {REPLY}" in final and live_region == "polite"
