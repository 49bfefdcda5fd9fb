"""The kiosk page in headless Chromium on the duplex model: an app with the kiosk's ``duplex: true`` and a
moshi-tiny folder (written by ``init-model``) as its duplex model, served by uvicorn in a thread (as the other
kiosk browser tests; the scripted cascade beside it). The page asks for the duplex model in its offer, the
session runs on the frame engine with the fake microphone's audio going in and the model's audio coming out
(the page's reply level rises), the model's text arrives on the data channel, and closing the page frees the
engine row."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile
from _kiosk_server import ScriptedReplies
from test_browser_voice_chat import free_port
from test_kiosk_browser import chromium, live, open_kiosk, run_in_thread, wait_until

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.kiosk.config import KioskConfig

pytestmark = pytest.mark.slow
HAS = "(t) => kiosk.events.some((e) => e.type === t)"


def test_kiosk_page_runs_the_duplex_model(tmp_path):
    folder = tmp_path / "moshi"
    cli = [sys.executable, "-m", "omniduplex.cli.main", "init-model", "--arch", "moshi-tiny", "--out"]
    subprocess.run([*cli, str(folder)], check=True)
    t = np.arange(48000 * 4) / 48000
    mic = tmp_path / "mic.wav"
    soundfile.write(mic, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 48000)
    cfg = ServerConfig(
        max_sessions=4,
        media_timeout_s=3.0,
        kiosk=KioskConfig(duplex=True),
        duplex_model=str(folder),
        duplex_sessions=2,
    )
    app = create_app(cfg, responder=ScriptedReplies())
    port = free_port()
    srv, thread = run_in_thread(app, port, start_timeout_s=120)
    state = app.state.server
    try:
        with chromium(mic) as context:
            page = open_kiosk(context, f"http://127.0.0.1:{port}")
            live(page, 60)
            wait_until(page, f"() => ({HAS})('session_started')", 20, "the duplex session")
            started = page.evaluate("kiosk.events.find((e) => e.type === 'session_started')")
            assert started["duplex"] is True
            assert state.duplex.stats()["sessions"] == 1
            wait_until(page, f"() => ({HAS})('duplex_text')", 30, "the model's text")
            wait_until(page, "() => kiosk.replyLevelMax > 0.01", 30, "the model's audio playing")
            page.close()
            deadline = time.monotonic() + 20
            while state.duplex.stats()["sessions"] != 0:
                assert time.monotonic() < deadline, "the engine row was not freed"
                time.sleep(0.1)
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
