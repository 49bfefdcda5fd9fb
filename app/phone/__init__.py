"""Phone surfaces: the Twilio-compatible media-stream bridge (:mod:`.twilio`, :mod:`.routes`) and the SIP
UAS (:mod:`.sip`), over the shared narrowband codec and resamplers (:mod:`.narrowband`)."""
