"""A SIP call on the duplex model (``--duplex-surfaces phone``): SIPp places a call and streams the caller's
audio, the app (in process, as the other SIP tests; a moshi-tiny folder written by ``init-model`` as its
duplex model, a tone responder as the cascade beside it) answers, and every 20 ms RTP packet we send carries
the model's audio while the caller talks; the BYE frees the engine row."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
from _phone import ServedApp, ToneResponder, free_port
from _sip import LoopbackCapture, decode_stream, sipp, sipp_errors, write_caller

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.phone.config import SipConfig

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("sipp") is None, reason="needs sipp")]


def test_sip_call_on_the_duplex_model_gets_its_audio_every_frame(tmp_path):
    folder = tmp_path / "moshi"
    cli = [sys.executable, "-m", "omniduplex.cli.main", "init-model", "--arch", "moshi-tiny", "--out"]
    subprocess.run([*cli, str(folder)], check=True)
    t = np.arange(3 * 8000) / 8000
    write_caller(tmp_path / "caller.ulaw", 0.5, (0.3 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16))
    low = random.randrange(20000, 30000, 200)
    sip = SipConfig(port=free_port(socket.SOCK_DGRAM), rtp_ports=(low, low + 98))
    cfg = ServerConfig(
        max_sessions=4, sip=sip, duplex_model=str(folder), duplex_sessions=2, duplex_surfaces=("phone",)
    )
    srv = ServedApp(create_app(cfg, responder=ToneResponder()))
    with srv, LoopbackCapture(range(sip.rtp_ports[0], sip.rtp_ports[1] + 1)) as cap:
        r = sipp("uac_speech.xml", sip.port, tmp_path, "-m", "1", "-d", "4000")
        assert r.returncode == 0, r.stdout[-2000:] + sipp_errors(tmp_path)
        stats = srv.state.metrics()["duplex"]
        assert stats["ticks"] > 0 and stats["sessions"] == 0  # the call ran on the engine; BYE freed its row
        assert srv.app.state.sip.calls == {}
    if not cap.available:
        pytest.skip("no CAP_NET_RAW: the RTP capture checks need root")
    (stream,) = cap.streams().values()
    pcm, _ = decode_stream(stream)
    assert len(stream) >= 4.0 / 0.020 * 0.9  # a packet every 20 ms while the caller talks
    loud = np.abs(pcm.astype(np.int32)).reshape(-1, 160).max(axis=1) > 300
    assert loud.sum() >= 0.5 * len(loud)  # the model's (random-weight) audio, not silence
