"""The SIP UAS at its edges, with SIPp and raw sockets: digest authentication, CANCEL while ringing,
hold/resume by re-INVITE, a caller that vanishes without BYE, unsupported codecs, malformed requests and
stray RTP — each answered without disturbing a call in progress."""

from __future__ import annotations

import shutil
import socket
import struct
import time

import numpy as np
import pytest
from _phone import ToneResponder, question_8k
from _sip import (
    LoopbackCapture,
    decode_stream,
    offer,
    raw_request,
    sipp,
    sipp_errors,
    status_of,
    write_caller,
)
from test_phone_sip import released, sip_server, sip_state, wait_until

from omniduplex.app.surfaces.phone.sip.auth import digest_response, parse_digest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("sipp") is None, reason="needs sipp")]


def udp_client() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(3)
    return s


def final_response(s: socket.socket, method: str | None = None) -> bytes:
    """The first non-100 response on ``s`` (to ``method`` if given, by its CSeq: a retransmitted 200 OK to
    the INVITE may still arrive after the ACK was sent, RFC 3261 §13.3.1.4)."""
    while True:
        data = s.recv(65535)
        cseq = data.decode(errors="replace").split("CSeq:", 1)[-1].split("\r\n", 1)[0].split()
        if status_of(data) != 100 and (method is None or cseq[-1:] == [method]):
            return data


def test_digest_authentication(tmp_path):
    write_caller(tmp_path / "caller.ulaw", 1.0)
    srv, sip = sip_server(ToneResponder(), users={"alice": "s3cret"})
    with srv:
        ok = sipp("uac_auth.xml", sip.port, tmp_path, "-m", "1", "-au", "alice", "-ap", "s3cret")
        assert ok.returncode == 0, ok.stdout[-2000:] + sipp_errors(tmp_path)
        s = udp_client()
        here = s.getsockname()
        s.sendto(raw_request("INVITE", sip.port, here, "auth-1", offer(40000)), ("127.0.0.1", sip.port))
        challenge = final_response(s)
        assert status_of(challenge) == 401
        header = next(ln for ln in challenge.decode().split("\r\n") if ln.startswith("WWW-Authenticate:"))
        p = parse_digest(header.split(":", 1)[1])
        uri = f"sip:assistant@127.0.0.1:{sip.port}"
        wrong = digest_response("alice", p["realm"], "guess", "INVITE", uri, p["nonce"])
        auth = (
            f'Digest username="alice", realm="{p["realm"]}", nonce="{p["nonce"]}", uri="{uri}", '
            f'response="{wrong}"'
        )
        s.sendto(
            raw_request("INVITE", sip.port, here, "auth-2", offer(40000), extra=f"Authorization: {auth}\r\n"),
            ("127.0.0.1", sip.port),
        )
        assert status_of(final_response(s)) == 403
    assert srv.state.metrics()["sessions_started"] == 1


def test_cancel_while_ringing_gets_487(tmp_path):
    srv, sip = sip_server(ToneResponder(), ring_s=3.0)
    with srv:
        r = sipp("uac_cancel.xml", sip.port, tmp_path, "-m", "1")
        assert r.returncode == 0, r.stdout[-2000:] + sipp_errors(tmp_path)
        wait_until(lambda: released(srv), 10, "the cancelled call released")


def test_hold_and_resume_by_reinvite(tmp_path):
    write_caller(tmp_path / "caller.ulaw", 6.0)
    srv, sip = sip_server(ToneResponder())
    with srv, LoopbackCapture(range(sip.rtp_ports[0], sip.rtp_ports[1] + 1)) as cap:
        r = sipp("uac_hold.xml", sip.port, tmp_path, "-m", "1", "-trace_logs")
        assert r.returncode == 0, r.stdout[-2000:] + sipp_errors(tmp_path)
    logs = "".join(p.read_text() for p in tmp_path.glob("*_logs.log"))
    assert "held: a=recvonly" in logs and "resumed: a=sendrecv" in logs
    if cap.available:
        (packets,) = cap.streams().values()
        gaps = np.diff([p.t for p in packets])
        held = int(np.argmax(gaps))
        # nothing sent while held: the hold is applied before its 200 OK, and SIPp resumes 1.5 s after that
        # answer, so the gap is at least ~1.5 s however loaded the machine (a slow resume only lengthens it)
        assert gaps[held] > 1.2, gaps[held]
        assert len(packets) - held - 1 >= 10  # then the stream resumes (SIPp stays 1 s after resuming)


@pytest.mark.parametrize(
    ("audio_s", "limits"),
    [(1.0, {"rtp_timeout_s": 2.0}), (6.0, {"call_timeout_s": 2.0})],
    ids=["caller vanishes: RTP timeout", "call timeout"],
)
def test_server_hangs_up_on_rtp_timeout_and_call_timeout(tmp_path, audio_s, limits):
    write_caller(tmp_path / "caller.ulaw", audio_s)  # then no more RTP, and SIPp never sends BYE
    srv, sip = sip_server(ToneResponder(), **limits)
    with srv:
        t0 = time.monotonic()
        r = sipp("uac_vanish.xml", sip.port, tmp_path, "-m", "1")
        assert r.returncode == 0, r.stdout[-2000:] + sipp_errors(tmp_path)  # SIPp got our BYE
        assert time.monotonic() - t0 > 1.9  # not before the limit (a late BYE only fails SIPp's own timeout)
        wait_until(lambda: released(srv), 10, "the call released after our BYE")


def test_malformed_requests_and_stray_rtp_leave_a_call_in_progress_alone(tmp_path):
    write_caller(tmp_path / "caller.ulaw", 0.5, question_8k(), 5.0)
    srv, sip = sip_server(ToneResponder())
    target = ("127.0.0.1", sip.port)
    with srv, LoopbackCapture(range(sip.rtp_ports[0], sip.rtp_ports[1] + 1)) as cap:
        call_proc = sipp("uac_speech.xml", sip.port, tmp_path, "-m", "1", "-d", "9000", background=True)
        deadline = time.monotonic() + 10
        while not sip_state(srv) and time.monotonic() < deadline:
            time.sleep(0.05)
        (call,) = sip_state(srv)
        s = udp_client()
        here = s.getsockname()
        cases = {
            "no Via": (raw_request("OPTIONS", sip.port, here, drop=("Via",)), 400),
            "no Call-ID": (raw_request("INVITE", sip.port, here, body=offer(40000), drop=("Call-ID",)), 400),
            "CSeq method": (raw_request("BYE", sip.port, here, cseq="1 INVITE"), 400),
            "Content-Length too big": (
                raw_request("INVITE", sip.port, here, "m1", offer(40000), content_length="9999"),
                400,
            ),
            "Content-Length not a number": (
                raw_request("OPTIONS", sip.port, here, content_length="ten"),
                400,
            ),
            "no SDP": (raw_request("INVITE", sip.port, here, "m2"), 488),
            "not SDP": (raw_request("INVITE", sip.port, here, "m3", "hello", content_type="text/plain"), 488),
            "G.729 only": (raw_request("INVITE", sip.port, here, "m4", offer(40000, "18", "")), 488),
            "SRTP only": (
                raw_request("INVITE", sip.port, here, "m5", offer(40000).replace("RTP/AVP", "RTP/SAVP")),
                488,
            ),
            "unknown method": (raw_request("SUBSCRIBE", sip.port, here), 405),
            "BYE for no call": (raw_request("BYE", sip.port, here, "nobody"), 481),
            "OPTIONS": (raw_request("OPTIONS", sip.port, here), 200),
        }
        got = {}
        s.sendto(b"\x00\xffnot sip at all", target)  # dropped: no answer, nothing breaks
        for name, (data, _) in cases.items():
            s.sendto(data, target)
            got[name] = status_of(final_response(s))
        with socket.create_connection(target, timeout=3) as tcp:  # TCP without Content-Length: framing lost
            tcp.sendall(raw_request("OPTIONS", sip.port, tcp.getsockname(), drop=("Content-Length",)))
            reply = tcp.recv(65535)
            assert status_of(reply) == 400 and tcp.recv(65535) == b""  # answered, then closed
        # RTP to the call's port from a stranger: counted, dropped (wrong payload types: test_phone_sip_units)
        rtp = struct.pack("!BBHII", 0x80, 0, 1, 160, 1234) + bytes(160)
        s.sendto(rtp, ("127.0.0.1", call.port))
        wait_until(lambda: call.rtp.ignored_source > 0, 5, "the stray RTP packet counted")
        stray = call.rtp.ignored_source
        out, _ = call_proc.communicate(timeout=30)
        assert call_proc.returncode == 0, out[-2000:] + sipp_errors(tmp_path)
    assert got == {name: want for name, (_, want) in cases.items()}
    assert stray == 1
    assert call.session.stats.turns == 1 and call.ended_reason == "caller hung up"
    if cap.available:
        (packets,) = cap.streams().values()
        pcm, _ = decode_stream(packets)
        assert (np.abs(pcm.astype(np.int32)).reshape(-1, 160).max(axis=1) > 300).sum() > 100  # the reply


def test_raw_call_silence_packets_dtmf_events_and_wrong_payload_types():
    """A hand-made caller: RTP from the advertised port, RFC 4733 digit 5 (end packet sent three times),
    a payload type that was not negotiated; the server streams silence while it has nothing to say; a BYE
    from another dialog (From tag) is 481."""
    srv, sip = sip_server(ToneResponder())
    with srv:
        s, media = udp_client(), udp_client()
        here, mport = s.getsockname(), media.getsockname()[1]
        invite = raw_request("INVITE", sip.port, here, "dtmf-1", offer(mport), from_tag="caller1")
        s.sendto(invite, ("127.0.0.1", sip.port))
        ok = final_response(s)
        assert status_of(ok) == 200
        server_rtp = int(ok.decode().split("m=audio ")[1].split()[0])
        to_tag = ok.decode().split("To: ")[1].split("\r\n")[0]
        ack = raw_request("ACK", sip.port, here, "dtmf-1", from_tag="caller1", to=to_tag)
        s.sendto(ack, ("127.0.0.1", sip.port))  # stops the 200 OK retransmissions
        (call,) = sip_state(srv)

        def rtp(pt, seq, ts, payload, marker=False):
            hdr = struct.pack("!BBHII", 0x80, (0x80 if marker else 0) | pt, seq, ts, 42)
            media.sendto(hdr + payload, ("127.0.0.1", server_rtp))

        for i in range(10):
            rtp(0, i, 160 * i, b"\xff" * 160)
        for n in range(5):  # digit 5: start, continuation, then end ×3 (same timestamp)
            rtp(
                101,
                10 + n,
                1600,
                bytes([5, 0x8A if n >= 2 else 0x0A]) + struct.pack("!H", 160 * (n + 1)),
                n == 0,
            )
        rtp(8, 15, 1760, b"\xd5" * 160)  # PCMA was not negotiated
        got = [media.recv(2000) for _ in range(25)]
        wait_until(lambda: call.digits and call.rtp.ignored_pt, 5, "the digit and the PCMA packet seen")
        digits, ignored_pt = list(call.digits), call.rtp.ignored_pt
        stranger = raw_request("BYE", sip.port, here, "dtmf-1", cseq="2 BYE", to=to_tag)
        s.sendto(stranger, ("127.0.0.1", sip.port))  # right Call-ID, another From tag: not this dialog
        assert status_of(final_response(s, "BYE")) == 481
        bye = raw_request("BYE", sip.port, here, "dtmf-1", cseq="3 BYE", from_tag="caller1", to=to_tag)
        s.sendto(bye, ("127.0.0.1", sip.port))
        assert status_of(final_response(s, "BYE")) == 200
        wait_until(lambda: srv.state.sessions == {}, 10, "the call released after its BYE")
    assert digits == ["5"] and ignored_pt == 1
    assert all(p[1] & 0x7F == 0 and p[12:] == b"\xff" * 160 for p in got)  # PCMU silence, one per 20 ms
