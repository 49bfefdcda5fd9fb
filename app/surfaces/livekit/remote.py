"""The remote plugin: a LiveKit ``RealtimeModel`` whose sessions talk to an omniduplex server over its GA
Realtime API (``/v1/realtime``), so agent workers scale apart from model servers. The protocol is typed both
ways: server events arrive parsed into the models of
:mod:`omniduplex.app.surfaces.wire.realtime.server_events`, and client
events are built from the models of :mod:`omniduplex.app.surfaces.wire.realtime.client_events` (the server's
own).

Server → framework: ``input_audio_buffer.speech_started|speech_stopped`` → ``input_speech_started|stopped``
(the server's VAD interrupts a reply as soon as speech starts, as the API does);
``conversation.item.input_audio_transcription.completed`` → ``input_audio_transcription_completed``;
``response.created`` → ``generation_created`` (``user_initiated`` when its ``metadata.client_event_id`` is a
``generate_reply`` of ours), ``response.output_item.added`` → a message, ``response.output_audio.delta`` /
``response.output_audio_transcript.delta`` → its audio / text streams, ``response.done`` → the streams end;
``error`` → the pending request fails (or an ``error`` event for server errors).

Framework → server: ``push_audio`` → ``input_audio_buffer.append`` (24 kHz PCM16); ``generate_reply`` →
``response.create``; ``interrupt`` → ``response.cancel``; ``truncate`` → ``conversation.item.truncate``;
``update_instructions`` → ``session.update``; ``update_chat_ctx`` → ``conversation.item.delete|create``.

Barge-in: with server turn detection that interrupts responses (``server_vad`` / ``semantic_vad``,
``interrupt_response`` on: the default), the server cancels the response in flight itself when the user
starts speaking: the client is told ``input_audio_buffer.speech_started`` (→ ``input_speech_started``: the
framework interrupts its playback) and then ``response.done`` with ``status: cancelled``, ``reason:
turn_detected`` and an ``incomplete`` message; the server's history keeps the words of the audio it had
sent. The plugin ends the generation's streams there, as livekit-plugins-openai does, and sends no
``response.cancel`` of its own for it (the server is already cancelling it). When the room had already played
all the audio the server had sent (the reply's next clause had not arrived yet), the framework may see the
streams end before its interruption lands: its playback then reports the whole of what was sent as played
and not interrupted, which is what the room heard; nothing of it needs truncating.

A server that is down or restarts: everything in flight ends at once (the reply's streams close, pending
``generate_reply`` futures fail with ``RealtimeError``), one recoverable ``error`` event per outage reaches
the AgentSession, and the link reconnects with backoff (:class:`~.remote_link.RetryPolicy`); on reconnection
the instructions and the conversation are sent again and ``session_reconnected`` is emitted. After
``give_up_after_s`` the error is unrecoverable and the AgentSession closes (the agent leaves the room).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omniduplex.app.surfaces.livekit.generation import PipelineModel
from omniduplex.app.surfaces.livekit.remote_link import RetryPolicy
from omniduplex.app.surfaces.livekit.remote_session import RemoteRealtimeSession


@dataclass
class RemoteOptions:
    """``url``: the server's realtime endpoint (``ws://host:8000/v1/realtime``); ``api_key``: one of its
    ``--api-key`` s (``None`` for a server without keys); ``turn_detection``: the session's
    ``audio.input.turn_detection`` (server VAD by default); ``user_transcription``: the server's graph
    transcribes the user (the cascade does); ``response_timeout_s``: how long ``generate_reply`` waits for
    ``response.created``."""

    url: str
    api_key: str | None = None
    turn_detection: dict = field(default_factory=lambda: {"type": "server_vad"})
    user_transcription: bool = True
    response_timeout_s: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)


class RemoteRealtimeModel(PipelineModel):
    """An omniduplex server as a LiveKit realtime model (capabilities:
    :func:`~.generation.pipeline_capabilities`)."""

    def __init__(self, options: RemoteOptions) -> None:
        super().__init__(options.user_transcription)
        self.options = options

    def session(self, *, turn_detection_disabled: bool = False) -> RemoteRealtimeSession:
        """A new session on its own connection. ``turn_detection_disabled`` is not supported and ignored."""
        s = RemoteRealtimeSession(self)
        self.sessions.add(s)
        return s
