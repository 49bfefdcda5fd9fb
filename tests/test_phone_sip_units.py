"""The SIP UAS's pure parts: message parsing and framing (RFC 3261), SDP offer/answer (RFC 3264/4566),
digest admission (RFC 2617/8760), RTP packets, RFC 4733 events, the jitter buffer, the RTP source and
payload-type filter. End to end with SIPp: tests/e2e/test_phone_sip*.py."""

from __future__ import annotations

import struct

import pytest

from omniduplex.app.surfaces.phone.config import SipConfig
from omniduplex.app.surfaces.phone.sip import message as sipmsg
from omniduplex.app.surfaces.phone.sip import sdp
from omniduplex.app.surfaces.phone.sip.auth import Gate, digest_response, parse_digest
from omniduplex.app.surfaces.phone.sip.rtp import (
    JitterBuffer,
    PortPool,
    RtpEndpoint,
    build_rtp,
    parse_dtmf,
    parse_rtp,
)

INVITE = (
    b"INVITE sip:bot@example.com SIP/2.0\r\n"
    b"v: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKaaa\r\n"
    b"Via: SIP/2.0/UDP 10.0.0.9;branch=z9hG4bKbbb\r\n"
    b'f: "Al" <sip:al@example.com>;tag=1234\r\n'
    b"t: <sip:bot@example.com>\r\n"
    b"i: abc@10.0.0.1\r\n"
    b"CSeq: 7 INVITE\r\n"
    b"Subject: a folded\r\n  header\r\n"
    b"c: application/sdp\r\n"
    b"l: 5\r\n\r\n"
    b"hello-and-more"
)


def test_parse_request_with_compact_and_folded_headers():
    m = sipmsg.parse(INVITE)
    assert m.method == "INVITE" and m.uri == "sip:bot@example.com"
    assert m.get_all("Via") == [
        "SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKaaa",
        "SIP/2.0/UDP 10.0.0.9;branch=z9hG4bKbbb",
    ]
    assert m.branch == "z9hG4bKaaa" and m.call_id == "abc@10.0.0.1" and m.cseq == (7, "INVITE")
    assert m.tag("From") == "1234" and m.tag("To") == "" and m.get("subject") == "a folded header"
    assert m.body == b"hello"  # Content-Length 5: the rest of the datagram is dropped


def test_response_copies_the_transaction_headers():
    m = sipmsg.parse(INVITE)
    r = sipmsg.parse(sipmsg.response(m, 486, to_tag="xyz"))
    assert r.status == 486 and r.reason == "Busy Here"
    assert r.get_all("Via") == m.get_all("Via") and r.get("From") == m.get("From") and r.cseq == (7, "INVITE")
    assert r.tag("To") == "xyz" and r.get("Content-Length") == "0"
    assert sipmsg.parse(sipmsg.response(m, 100, to_tag="xyz")).tag("To") == ""  # never on 100 Trying


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"HELLO\r\n\r\n", "bad start line"),
        (b"INVITE sip:x SIP/2.0\r\nno colon here\r\n\r\n", "bad header"),
        (b"OPTIONS sip:x SIP/2.0\r\nContent-Length: 10\r\n\r\nshort", "exceeds"),
        (b"OPTIONS sip:x SIP/2.0\r\nContent-Length: x\r\n\r\n", "bad Content-Length"),
    ],
)
def test_parse_errors(data, why):
    with pytest.raises(sipmsg.SipParseError, match=why) as e:
        sipmsg.parse(data)
    assert e.value.status == 400


def test_tcp_framing_by_content_length():
    one = b"OPTIONS sip:x SIP/2.0\r\nCall-ID: 1\r\nContent-Length: 3\r\n\r\nabc"
    two = b"BYE sip:x SIP/2.0\r\nCall-ID: 2\r\nContent-Length: 0\r\n\r\n"
    f = sipmsg.StreamFramer()
    assert f.feed(b"\r\n\r\n" + one[:20]) == []  # keep-alive CRLFs, then a partial message
    assert f.feed(one[20:] + two[:10]) == [one]
    assert f.feed(two[10:]) == [two]
    with pytest.raises(sipmsg.SipParseError, match="mandatory"):
        sipmsg.StreamFramer().feed(b"OPTIONS sip:x SIP/2.0\r\nCall-ID: 1\r\n\r\n")


def offer(m: str, attrs: str = "", conn: str = "192.0.2.5") -> str:
    return f"v=0\r\no=- 1 1 IN IP4 {conn}\r\ns=-\r\nc=IN IP4 {conn}\r\nt=0 0\r\n{m}\r\n{attrs}"


def test_negotiate_picks_the_offerers_first_g711_and_telephone_events():
    o = sdp.parse(
        offer("m=audio 4000 RTP/AVP 18 8 0 101", "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n")
    )
    n = sdp.negotiate(o)
    assert (n.codec, n.pt, n.dtmf_pt, n.remote, n.direction) == (
        "PCMA",
        8,
        101,
        ("192.0.2.5", 4000),
        "sendrecv",
    )
    ans = sdp.answer(n, "198.51.100.1", 10002, 1, 1)
    assert (
        "m=audio 10002 RTP/AVP 8 101\r\n" in ans
        and "a=rtpmap:8 PCMA/8000" in ans
        and "c=IN IP4 198.51.100.1" in ans
    )


def test_answer_rejects_other_streams_with_port_0_and_mirrors_hold():
    o = sdp.parse(offer("m=video 5000 RTP/AVP 96\r\nm=audio 4000 RTP/AVP 0", "a=sendonly\r\n"))
    n = sdp.negotiate(o)
    assert n.direction == "recvonly" and not n.we_send and n.we_receive
    ans = sdp.answer(n, "198.51.100.1", 10002, 1, 2)
    assert "m=video 0 RTP/AVP 96" in ans and "a=recvonly" in ans
    assert sdp.negotiate(sdp.parse(offer("m=audio 4000 RTP/AVP 0", conn="0.0.0.0"))).direction == "recvonly"
    assert sdp.negotiate(sdp.parse(offer("m=audio 4000 RTP/AVP 0", "a=inactive\r\n"))).direction == "inactive"


@pytest.mark.parametrize(
    ("m", "status", "warning"),
    [
        ("m=audio 4000 RTP/AVP 18 9", 488, 305),
        ("m=audio 4000 RTP/SAVP 0", 488, 305),
        ("m=audio 0 RTP/AVP 0", 488, 304),
        ("m=video 4000 RTP/AVP 96", 488, 304),
    ],
)
def test_unacceptable_offers_are_488(m, status, warning):
    with pytest.raises(sdp.SdpError) as e:
        sdp.negotiate(sdp.parse(offer(m)))
    assert (e.value.status, e.value.warning) == (status, warning)


def test_unparseable_sdp_is_400():
    with pytest.raises(sdp.SdpError) as e:
        sdp.parse("hello")
    assert e.value.status == 400


def test_digest_gate():
    now = [1000.0]
    gate = Gate({"alice": "pw"}, ["10.9.9.9"], "omni", nonce_ttl_s=60, clock=lambda: now[0])
    assert gate.check("10.9.9.9", "INVITE", None).status == 0  # allow-listed
    v = gate.check("10.0.0.1", "INVITE", None)
    assert v.status == 401 and 'realm="omni"' in v.challenge
    p = parse_digest(v.challenge)
    resp = digest_response(
        "alice", "omni", "pw", "INVITE", "sip:bot@h", p["nonce"], "auth", "00000001", "c0ffee"
    )
    auth = (
        f'Digest username="alice", realm="omni", nonce="{p["nonce"]}", uri="sip:bot@h", response="{resp}", '
        f'qop=auth, nc=00000001, cnonce="c0ffee", algorithm=MD5'
    )
    assert gate.check("10.0.0.1", "INVITE", auth).status == 0
    assert gate.check("10.0.0.1", "INVITE", auth.replace(resp, "0" * 32)).status == 403
    now[0] += 120
    stale = gate.check("10.0.0.1", "INVITE", auth)
    assert stale.status == 401 and "stale=true" in stale.challenge
    assert Gate({}, ["10.9.9.9"], "omni").check("10.0.0.1", "INVITE", None).status == 403
    assert Gate({}, [], "omni").check("10.0.0.1", "INVITE", None).status == 0


def test_rtp_round_trip_and_header_extensions():
    pkt = parse_rtp(build_rtp(0, 65535, 4294967200, 0xDEADBEEF, b"\xff" * 160, marker=True))
    assert (pkt.pt, pkt.seq, pkt.ts, pkt.ssrc, pkt.marker, len(pkt.payload)) == (
        0,
        65535,
        4294967200,
        0xDEADBEEF,
        True,
        160,
    )
    ext = struct.pack("!BBHII", 0x90 | 0x01, 8, 1, 0, 1) + b"\0\0\0\1" + b"\xbe\xde\0\1" + b"xxxx" + b"pay"
    assert parse_rtp(ext).payload == b"pay"  # one CSRC and a one-word extension skipped
    assert parse_rtp(b"\x40" + bytes(20)) is None and parse_rtp(b"\x80\x00") is None


def test_rfc4733_events():
    assert parse_dtmf(bytes([5, 0x8A, 0x03, 0x20])) == ("5", True, 800)
    assert parse_dtmf(bytes([11, 0x0A, 0, 160])) == ("#", False, 160)
    assert parse_dtmf(bytes([40, 0, 0, 0])) is None


def test_jitter_buffer_reorders_conceals_losses_and_wraps():
    jb = JitterBuffer(depth=3)
    for seq in (65534, 0, 65535):  # out of order, across the 16-bit wrap
        jb.push(seq, bytes([seq & 0xFF]))
    assert [jb.pop() for _ in range(3)] == [bytes([0xFE]), bytes([0xFF]), bytes([0])]
    assert jb.pop() is None and jb.underruns == 1  # empty: silence, and re-buffer
    for seq in (1, 3, 4):
        jb.push(seq, b"x")
    assert [jb.pop() for _ in range(4)] == [b"x", None, b"x", b"x"] and jb.lost == 1
    jb.push(2, b"late")
    assert jb.late == 1


def test_rtp_endpoint_accepts_only_the_negotiated_source_and_payload_types():
    got = []
    ep = RtpEndpoint(got.append)
    ep.remote, ep.accept_pts = ("192.0.2.5", 4000), {0, 101}
    ep.datagram_received(build_rtp(0, 1, 160, 7, b"a"), ("192.0.2.6", 4000))
    ep.datagram_received(build_rtp(8, 2, 320, 7, b"b"), ("192.0.2.5", 4000))
    ep.datagram_received(b"junk", ("192.0.2.5", 4000))
    ep.datagram_received(build_rtp(0, 3, 480, 7, b"c"), ("192.0.2.5", 4000))
    assert [p.payload for p in got] == [b"c"] and (ep.ignored_source, ep.ignored_pt) == (1, 2)


def test_port_pool_hands_out_even_ports():
    pool = PortPool(10001, 10006)
    assert [pool.take(), pool.take()] == [10002, 10004]
    pool.give(10002)
    assert pool.take() == 10006 and pool.take() == 10002
    with pytest.raises(RuntimeError):
        pool.take()


def test_sip_config_parse():
    c = SipConfig.parse("0.0.0.0:5070", "20000-20100", max_calls=3)
    assert (c.host, c.port, c.rtp_ports, c.max_calls) == ("0.0.0.0", 5070, (20000, 20100), 3)
    for bad in (("nohost", "1-2"), ("h:99999", "1-2"), ("h:5060", "9-3")):
        with pytest.raises(ValueError):
            SipConfig.parse(*bad)
