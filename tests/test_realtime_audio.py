"""The Realtime protocol's audio codecs (oracle: CPython's ``audioop``, deprecated, still in 3.11/3.12, for
G.711), the runtime's independence from the ``openai`` package, and the input buffer with server VAD."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from omniduplex.app.core.audio import to_float32
from omniduplex.app.surfaces.wire.realtime import audio
from omniduplex.app.surfaces.wire.realtime.protocol import (
    ProtocolError,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")


ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)


def test_g711_decode_matches_audioop():
    codes = bytes(range(256))
    for fmt, ref in (("audio/pcmu", audioop.ulaw2lin), ("audio/pcma", audioop.alaw2lin)):
        want = np.frombuffer(ref(codes, 2), "<i2")
        np.testing.assert_array_equal(audio.decode(codes, fmt), want)


def test_g711_encode_matches_audioop_for_every_sample():
    for fmt, ref in (("audio/pcmu", audioop.lin2ulaw), ("audio/pcma", audioop.lin2alaw)):
        assert audio.encode(ALL_INT16, fmt) == ref(ALL_INT16.astype("<i2").tobytes(), 2)
        assert audio.encode(ALL_INT16.astype(np.float32) / 32768, fmt) == ref(ALL_INT16.tobytes(), 2)


def test_g711_round_trips():
    codes = bytes(range(256))
    assert audio.encode(audio.decode(codes, "audio/pcma"), "audio/pcma") == codes
    again = audio.encode(audio.decode(codes, "audio/pcmu"), "audio/pcmu")
    assert [i for i in range(256) if again[i] != codes[i]] == [0x7F]  # μ-law's −0 encodes as +0 (0xFF)
    x = np.linspace(-0.9, 0.9, 4001, dtype=np.float32)
    for fmt in ("audio/pcmu", "audio/pcma"):  # 8-bit log PCM: ≤ 1/16 relative error above the linear floor
        y = to_float32(audio.decode(audio.encode(x, fmt), fmt))
        assert np.all(np.abs(y - x) <= np.abs(x) / 16 + 2**-9)


def test_pcm16_round_trip_and_errors():
    assert audio.decode(audio.encode(ALL_INT16, "audio/pcm"), "audio/pcm").tolist() == ALL_INT16.tolist()
    assert (
        audio.encode(np.array([1.5, -1.5, 0.5], np.float32), {"type": "audio/pcm"})
        == np.array([32767, -32768, 16384], "<i2").tobytes()
    )  # clipped, rounded
    with pytest.raises(ProtocolError) as ei:
        audio.decode(b"\x00\x01\x02", "audio/pcm", event_id="evt_odd")
    assert (ei.value.code, ei.value.event_id) == ("invalid_audio", "evt_odd")
    with pytest.raises(ProtocolError) as ei:
        audio.decode_payload("not base64!", "audio/pcm", event_id="evt_b64")
    assert (ei.value.code, ei.value.event_id, ei.value.param) == ("invalid_audio", "evt_b64", "audio")
    assert audio.b64decode(" AAE=\n") == b"\x00\x01"  # whitespace tolerated


def test_converters_stream_client_formats():
    rng = np.random.default_rng(2)
    x = (0.2 * rng.standard_normal(8000)).astype(np.float32)  # 1 s at 8 kHz
    payload = audio.encode(x, "audio/pcmu")
    whole = audio.decode_payload(base64.b64encode(payload).decode(), {"type": "audio/pcmu"})
    parts = [audio.decode_payload(payload[i : i + 160], "audio/pcmu") for i in range(0, len(payload), 160)]
    assert whole.dtype == np.int16 and np.array_equal(np.concatenate(parts), whole)  # 20 ms appends
    out = audio.OutputConverter("audio/pcm")  # 24 kHz session output → audio/pcm: no resampling
    pcm = (rng.integers(-3000, 3000, 480)).astype(np.int16)
    assert out.push(pcm) == pcm.astype("<i2").tobytes() and out.flush() == b""
    g711 = audio.OutputConverter("audio/pcma")
    n = len(g711.push(pcm)) + len(g711.flush())
    assert abs(n - 160) <= 2 and audio.OutputConverter.bytes_per_ms("audio/pcm") == 48.0


def test_runtime_does_not_import_openai():
    code = "import sys, omniduplex.app.surfaces.wire.realtime.audio as a, "
    code += "omniduplex.app.surfaces.wire.realtime.protocol as p; print('openai' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )


def test_server_vad_keeps_hearing_past_the_buffer_limit_and_manual_mode_is_told_to_commit():
    """With server VAD a long silence between turns must not make the session deaf: the buffer drops its
    oldest audio and every append still reaches the VAD; without VAD the client is told to commit."""
    from omniduplex.app.core.session import SessionConfig
    from omniduplex.app.surfaces.realtime.connection import RealtimeConnection, RealtimeLimits

    class Silent:
        output_rate = 24000

    conn = RealtimeConnection(
        None, "rt", Silent(), SessionConfig(), lambda: None, RealtimeLimits(max_buffer_s=1)
    )
    half_s = base64.b64encode(np.zeros(12000, "<i2").tobytes()).decode()  # 0.5 s of audio/pcm (24 kHz)
    append = json.dumps({"type": "input_audio_buffer.append", "audio": half_s})
    pushed: list[np.ndarray] = []
    conn.session.push_audio = pushed.append  # what reaches the session's VAD
    for _ in range(6):
        conn.handle(append)
    sent = [conn.outbox.get_nowait().type for _ in range(conn.outbox.qsize())]
    assert "error" not in sent and conn.buffer.samples <= 16000
    assert 148 <= len(pushed) <= 150  # all 3 s went to the VAD in 20 ms frames (less the resampler delay)
    conn.handle(
        json.dumps(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            }
        )
    )
    for _ in range(3):
        conn.handle(append)
    errors = [e for e in (conn.outbox.get_nowait() for _ in range(conn.outbox.qsize())) if e.type == "error"]
    assert [e.error.code for e in errors] == ["input_audio_buffer_too_large"] * 3  # the buffer is full
