"""What a Realtime session config (``session.update``) means for the core session: its turn-taking
(:func:`turn_config`) and its reply options (:func:`session_options`). Pure functions of the config."""

from __future__ import annotations

from dataclasses import replace

from omniduplex.app.core.vad import TurnConfig
from omniduplex.app.surfaces.wire.realtime.client_events import SemanticVad, ServerVad
from omniduplex.app.surfaces.wire.realtime.client_events import SessionConfig as RealtimeConfig

NEVER_MS = 10**9
"""A barge-in threshold no speech reaches: ``interrupt_response: false``, or no turn detection."""


def turn_config(cfg: RealtimeConfig, base: TurnConfig) -> TurnConfig:
    """The session's turn-taking for ``cfg`` over the server's thresholds ``base``: server VAD → the silence
    endpoint (``silence_duration_ms``, at least 100 ms; ``prefix_padding_ms`` of preroll); semantic VAD →
    Smart Turn; none → silence endpoint without barge-in (the VAD still reports speech).
    ``interrupt_response`` (the default) makes any speech that opens a segment during a reply a barge-in,
    as the API does."""
    td = cfg.audio.input.turn_detection
    if isinstance(td, ServerVad):
        return replace(
            base,
            turn_detection="silence",
            endpoint_ms=max(100, td.silence_duration_ms),
            preroll_ms=td.prefix_padding_ms,
            barge_in_ms=base.start_ms if td.interrupt_response else NEVER_MS,
        )
    if isinstance(td, SemanticVad):
        return replace(
            base, turn_detection="smart", barge_in_ms=base.start_ms if td.interrupt_response else NEVER_MS
        )
    return replace(base, turn_detection="silence", barge_in_ms=NEVER_MS)


def session_options(cfg: RealtimeConfig) -> dict:
    """The session options (:meth:`~omniduplex.app.core.session.Session.set_options`) for ``cfg``: the VAD
    commits turns when turn detection is on, and they are answered at once unless ``create_response`` is
    off (with turn detection off, ``response.create`` answers); the instructions, the voice and the function
    tools every response is offered (checked by :func:`.tools.check_tools` before)."""
    td = cfg.audio.input.turn_detection
    return {
        "vad_commit": td is not None,
        "auto_respond": td is None or td.create_response,
        "instructions": cfg.instructions or None,
        "voice": cfg.audio.output.voice,
        "tools": [t for t in cfg.tools if t.get("type", "function") != "mcp"] or None,  # mcp: .mcp
        "tool_choice": cfg.tool_choice,
    }
