"""The conversation core: one :class:`~.session.Session` per call (turn-taking, the conversation, live ASR,
history, playout, events, the responder contract) and the audio port (:mod:`.audio`). It imports nothing of
:mod:`omniduplex.app.host` or :mod:`omniduplex.app.surfaces` (``tests/test_layout.py``): surfaces change it
only through its methods."""
