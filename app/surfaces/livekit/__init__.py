"""LiveKit rooms: the pipeline as a livekit-agents ``RealtimeModel`` (optional extra ``omniduplex[livekit]``).

* :mod:`.local_model` / :mod:`.local_session`: the pipeline in this process, one
  :class:`~omniduplex.app.core.session.Session` per room.
* :mod:`.remote` / :mod:`.remote_link`: an omniduplex server over its Realtime API, so agent workers scale
  apart from model servers; reconnects with backoff when the server is down or restarts.
* :mod:`.generation` (what both hand the framework), :mod:`.turn_signals` (speech start/stop policy),
  :mod:`.chat_sync` (chat context ↔ history), :mod:`.audio` (frame conversion).
* :mod:`.worker`: ``omniduplex agent``, the worker run by livekit-agents' own CLI.
"""
