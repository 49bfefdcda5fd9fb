"""The kiosk on the real default pipeline (Whisper → SmolLM2 → Piper, packaged weights, stage processes) in
headless Chromium: a spoken question is heard (user captions = the ASR's words), answered and spoken (reply
captions arrive clause by clause with the audio), then a ``greet`` message gets a spoken welcome."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from speech import wer
from test_kiosk_browser import (
    chromium,
    free_port,
    live,
    open_kiosk,
    run_in_thread,
    shot,
    silence,
    sox,
    wait_until,
)

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.kiosk.config import KioskConfig

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTION = "How do I make a cup of green tea?"  # examples/green_tea.wav, the README's first command


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory):
    """3 s of quiet, the question, 180 s of quiet; 48 kHz mono (the fake microphone's format).
    Chromium loops the file: the quiet must outlast a slow (busy machine) reply, or the question comes
    round again as a barge-in."""
    d = tmp_path_factory.mktemp("kiosk-cascade")
    q = d / "q.wav"
    sox(str(EXAMPLES / "green_tea.wav"), "-r", "48000", "-c", "1", "-b", "16", str(q))
    out = d / "question.wav"
    sox(str(silence(3, d / "s3.wav")), str(q), str(silence(180, d / "s180.wav")), str(out))
    return out


def test_kiosk_on_the_default_cascade(question_wav):
    cfg = ServerConfig(max_sessions=2, kiosk=KioskConfig(title="omniduplex", attract_after_s=600))
    app = create_app(cfg)
    port = free_port()
    t0 = time.monotonic()
    srv, thread = run_in_thread(app, port, start_timeout_s=300)
    started_s = time.monotonic() - t0
    try:
        with chromium(question_wav) as context:
            page = open_kiosk(context, f"http://127.0.0.1:{port}", "&idle_timeout=600")
            live(page, 30)
            has = "(t) => kiosk.events.some((e) => e.type === t)"
            wait_until(page, f"() => ({has})('user_transcript')", 60, "the transcript")
            heard = page.evaluate("kiosk.events.find((e) => e.type === 'user_transcript').text")
            wait_until(page, "() => kiosk.state === 'speaking'", 60, "the spoken reply")
            page.wait_for_timeout(1200)
            shot(page, "cascade-speaking")
            wait_until(page, f"() => ({has})('reply_ended')", 90, "the reply's end")
            seen = page.evaluate(
                """() => {
                  const ended = kiosk.events.find((e) => e.type === 'reply_ended');
                  const spoken = kiosk.events.filter((e) => e.type === 'reply_spoken')
                    .filter((e) => e.turn_id === ended.turn_id);
                  return {captions: kiosk.captionsText(), log: kiosk.stateLog.map((s) => s.state), ended,
                    spoken: spoken.map((e) => e.text)};
                }"""
            )
            page.evaluate("kioskLink.send({type: 'greet'})")
            ends = "() => kiosk.events.filter((e) => e.type === 'reply_ended')"
            wait_until(page, f"() => ({ends})().length >= 2", 90, "the greeting's end")
            greeting = page.evaluate(f"() => ({ends})()[1]")
            shot(page, "cascade-greeting")
    finally:
        srv.should_exit = True
        thread.join(timeout=60)

    print(f"\npipeline start {started_s:.0f} s; heard {heard!r}; said {seen['ended']['text']!r}")
    print(f"greeting: {greeting['text']!r}")
    assert wer(QUESTION, heard) <= 0.25, heard
    assert seen["ended"]["reason"] == "completed" and seen["spoken"], seen
    assert seen["log"][:3] == ["listening", "thinking", "speaking"], seen["log"]
    # the reply's captions are its spoken clauses, which together are the reply
    assert " ".join(seen["spoken"]).split() == seen["ended"]["text"].split()
    assert f"You: {heard}" in seen["captions"] and "Assistant: " in seen["captions"]
    assert greeting["reason"] == "completed" and greeting["text"].strip()
