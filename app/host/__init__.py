"""The host: what every surface of ``omniduplex serve`` runs over. One :class:`~.state.ServerState` owns the
pipeline (built by :mod:`.pipeline`), admission and release of sessions (:mod:`.admission`), readiness, auth,
metrics, drain, logs and the speech and transcription services (:mod:`.speech`). It imports the core, never a
surface (``tests/test_layout.py``)."""
