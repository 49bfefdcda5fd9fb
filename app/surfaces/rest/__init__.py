"""The OpenAI-compatible REST audio endpoints: ``/v1/models``, ``/v1/audio/transcriptions``,
``/v1/audio/speech``, over the host's transcription and speech services."""
