"""The SIP UAS against SIPp (``apt-get install sip-tester``): calls whose caller audio is SIPp's
``rtp_stream`` of ``examples/question.wav`` as PCMU, the reply checked in a loopback capture of the RTP we
sent. Replies come from a scripted responder (espeak-ng speech or tones), so no model runs here."""

from __future__ import annotations

import random
import shutil
import socket
import time

import numpy as np
import pytest
import soxr
import webrtcvad
from _phone import ServedApp, SpeechResponder, ToneResponder, free_port, question_8k
from _sip import LoopbackCapture, decode_stream, sipp, sipp_errors, thread_cpu_s, write_caller

from omniduplex.app.core.session import SessionConfig
from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.app.surfaces.phone.config import SipConfig

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("sipp") is None, reason="needs sipp")]


def sip_server(responder, max_sessions: int = 16, **sip_kw):
    """The app with a SIP UAS on a free port and its own RTP range; returns (served app, SipConfig)."""
    low = random.randrange(20000, 30000, 200)
    sip = SipConfig(port=free_port(socket.SOCK_DGRAM), rtp_ports=(low, low + 98), **sip_kw)
    cfg = ServerConfig(
        max_sessions=max_sessions, session=SessionConfig(turn=TurnConfig(endpoint_ms=500)), sip=sip
    )
    return ServedApp(create_app(cfg, responder=responder)), sip


def sip_state(srv: ServedApp):
    calls = [c for c in srv.state.sessions.values() if hasattr(c, "rtp")]
    return calls


def wait_until(cond, timeout_s: float, what: str) -> None:
    """Poll ``cond()`` until true; fail after ``timeout_s`` seconds (a bound for a loaded machine, not a
    latency figure)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.02)


def released(srv: ServedApp) -> bool:
    """No session and no SIP call left (BYE handled, media loop ended)."""
    return srv.state.sessions == {} and srv.app.state.sip.calls == {}


def best_correlation(x: np.ndarray, ref: np.ndarray) -> float:
    """Max normalized cross-correlation of ``ref`` against windows of ``x`` (both float)."""
    n = len(x) + len(ref)
    size = 1 << (n - 1).bit_length()
    c = np.fft.irfft(np.fft.rfft(x, size) * np.conj(np.fft.rfft(ref, size)), size)[: len(x) - len(ref) + 1]
    energy = np.convolve(x**2, np.ones(len(ref)), "valid")
    return float(np.max(c / np.sqrt(np.maximum(energy, 1e-9) * np.sum(ref**2))))


def voiced_fraction(pcm8k: np.ndarray) -> float:
    vad = webrtcvad.Vad(2)
    x = soxr.resample(pcm8k.astype(np.float32) / 32768, 8000, 16000)
    frames = [(np.clip(x[i : i + 320], -1, 1) * 32767).astype(np.int16) for i in range(0, len(x) - 320, 320)]
    return sum(vad.is_speech(f.tobytes(), 16000) for f in frames) / max(1, len(frames))


@pytest.mark.parametrize("transport", ["u1", "t1"])
def test_call_gets_a_spoken_reply_and_bye_frees_everything(tmp_path, transport):
    responder = SpeechResponder()
    write_caller(tmp_path / "caller.ulaw", 0.5, question_8k(), 7.0)
    srv, sip = sip_server(responder)
    with srv, LoopbackCapture(range(sip.rtp_ports[0], sip.rtp_ports[1] + 1)) as cap:
        r = sipp("uac_speech.xml", sip.port, tmp_path, "-m", "1", "-d", "11000", transport=transport)
        assert r.returncode == 0, r.stdout[-2000:] + sipp_errors(tmp_path)
        wait_until(lambda: released(srv), 10, "the call released after its BYE")
        sipserver = srv.app.state.sip
        assert len(sipserver.ports.free) == len(range(sip.rtp_ports[0], sip.rtp_ports[1] + 1, 2))
        stats = srv.state.metrics()
    # one turn; any start before its reply's was a preemptive reply to the question so far (a pause in it),
    # cancelled when the caller went on
    assert stats["turns"] == 1 and all(t in responder.cancelled for t in responder.started[:-1])
    latency = stats["speech_end_to_first_audio_ms"]["last"]
    if not cap.available:
        pytest.skip("no CAP_NET_RAW: the RTP capture checks need root")
    (stream,) = cap.streams().values()
    pcm, times = decode_stream(stream)
    assert len(stream) >= 11.0 / 0.020 * 0.9  # a packet every 20 ms, silence included
    ref = soxr.resample(responder.audio, 24000, 8000)
    corr = best_correlation(pcm.astype(np.float32), ref.astype(np.float32) * 32767)
    loud = np.abs(pcm.astype(np.int32)).reshape(-1, 160).max(axis=1) > 300
    reply = pcm[np.argmax(loud) * 160 : (len(loud) - np.argmax(loud[::-1])) * 160]
    print(
        f"\n[sip/{transport}] speech end → first reply audio {latency:.0f} ms; reply matches the responder's "
        f"audio with correlation {corr:.3f}; {voiced_fraction(reply):.0%} of it voiced"
    )
    assert corr > 0.95
    assert voiced_fraction(reply) > 0.5


def test_barge_in_silences_the_reply_and_history_keeps_the_played_part(tmp_path):
    responder = ToneResponder()
    q = question_8k()
    write_caller(tmp_path / "caller.ulaw", 0.5, q, 2.2, q, 2.0)
    srv, sip = sip_server(responder)
    with srv, LoopbackCapture(range(sip.rtp_ports[0], sip.rtp_ports[1] + 1)) as cap:
        proc = sipp("uac_speech.xml", sip.port, tmp_path, "-m", "1", "-d", "12000", background=True)
        deadline = time.monotonic() + 20
        while not sip_state(srv) and time.monotonic() < deadline:
            time.sleep(0.05)
        (call,) = sip_state(srv)
        while call.session.stats.barge_ins == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        history = [list(e) for e in call.session.history.entries]
        stop_ms = list(call.session.stats.stop_ms)
        out, _ = proc.communicate(timeout=40)
        assert proc.returncode == 0, out[-2000:] + sipp_errors(tmp_path)
    # playout stops at the first frame pulled after the detection (Session.pull_audio): one stop recorded.
    # How many ms that took is a latency figure (printed below; `omniduplex bench realtime` measures it).
    assert call.session.stats.barge_ins == 1 and len(stop_ms) == 1, stop_ms
    kept = [t for role, t in history if role == "assistant"]
    assert kept and kept[0].split() and len(kept[0].split()) < 6
    if cap.available:
        (stream,) = cap.streams().values()
        pcm, times = decode_stream(stream)
        loud = np.abs(pcm.astype(np.int32)).reshape(-1, 160).max(axis=1) > 300
        start = int(np.argmax(loud))
        first_reply_frames = int(np.argmin(loud[start:]))  # the first reply's run of audible frames
        assert 0 < first_reply_frames < 2.8 / 0.02  # cut before its 3 s were played
        print(
            f"\n[sip] barge-in: playout stopped {stop_ms[0]:.1f} ms after detection (the next RTP packet is "
            f"silence); reply cut after {first_reply_frames * 20} ms; history keeps {kept[0]!r}"
        )


def test_ten_concurrent_calls(tmp_path):
    write_caller(tmp_path / "caller.ulaw", 0.5, question_8k(), 4.0)
    responder = SpeechResponder()
    srv, sip = sip_server(responder, max_sessions=12, max_calls=10)
    with srv, LoopbackCapture(range(sip.rtp_ports[0], sip.rtp_ports[1] + 1)) as cap:
        cpu0, t0 = thread_cpu_s(srv.thread), time.monotonic()
        r = sipp("uac_speech.xml", sip.port, tmp_path, "-m", "10", "-l", "10", "-r", "10", "-d", "8500")
        cpu, wall = thread_cpu_s(srv.thread) - cpu0, time.monotonic() - t0
        assert r.returncode == 0, r.stdout[-2000:] + sipp_errors(tmp_path)
        wait_until(lambda: released(srv), 10, "every call released after its BYE")
        stats = srv.state.metrics()
    assert stats["turns"] == 10 and stats["sessions_started"] == 10
    lat = stats["speech_end_to_first_audio_ms"]
    print(
        f"\n[sip] 10 concurrent calls: speech end → first reply audio p50 {lat['p50']:.0f} ms, max "
        f"{lat['max']:.0f} ms; server thread CPU {cpu:.2f} s over {wall:.1f} s = "
        f"{100 * cpu / wall / 10:.1f}% of a core per call"
    )
    if cap.available:
        streams = cap.streams()
        assert len(streams) == 10
        for packets in streams.values():
            pcm, _ = decode_stream(packets)
            assert (
                np.abs(pcm.astype(np.int32)).reshape(-1, 160).max(axis=1) > 300
            ).sum() > 100  # > 2 s reply


def test_max_calls_is_enforced_with_503(tmp_path):
    write_caller(tmp_path / "caller.ulaw", 1.0)
    srv, sip = sip_server(ToneResponder(), max_calls=2)
    with srv:
        holding = sipp(
            "uac_speech.xml",
            sip.port,
            tmp_path,
            "-m",
            "2",
            "-l",
            "2",
            "-r",
            "10",
            "-d",
            "4000",
            background=True,
        )
        deadline = time.monotonic() + 10
        while len(srv.app.state.sip.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = sipp("uac_503.xml", sip.port, tmp_path, "-m", "1")
        out, _ = holding.communicate(timeout=30)
        assert refused.returncode == 0, refused.stdout[-2000:] + sipp_errors(tmp_path)
        assert holding.returncode == 0, out[-2000:]
        assert srv.app.state.sip.stats["rejected"] == {503: 1}
