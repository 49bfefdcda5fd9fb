"""The SIP surface: a small RFC 3261 UAS (:mod:`.uas`) whose calls are sessions (:mod:`.call`), with SDP
(:mod:`.sdp`), RTP (:mod:`.rtp`), digest/allow-list admission (:mod:`.auth`), message parsing
(:mod:`.message`) and the UDP/TCP transports (:mod:`.transport`)."""

from omniduplex.app.surfaces.phone.sip.uas import SipServer, start_sip

__all__ = ["SipServer", "start_sip"]
