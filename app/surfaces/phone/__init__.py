"""Phone surfaces: the Twilio-compatible media-stream bridge (:mod:`.twilio`, :mod:`.twilio_routes`) and the
SIP UAS (:mod:`.sip`), over G.711 (:mod:`omniduplex.app.surfaces.wire.g711`) and the core's resamplers."""
