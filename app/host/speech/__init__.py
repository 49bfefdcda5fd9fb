"""Speech and transcription services of the host (``/v1/audio/speech``, ``/v1/audio/transcriptions``), each
behind one contract (:mod:`.contract`)."""
