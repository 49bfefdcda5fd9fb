"""Shared by the pipeline tests (in-process and stage processes): run one turn to its end."""

from __future__ import annotations

from omniduplex.pipeline.messages import TurnOptions
from omniduplex.pipeline.orchestrator import Orchestrator


async def run_turn(orch: Orchestrator, wav, options: TurnOptions):
    """Submit a turn and collect its events; returns ``(events, turn_record or None)`` (the record is
    taken at ``done``, while the turn is still known)."""
    rid = orch.submit(wav, options)
    events, record = [], None
    async for ev in orch.events(rid):
        events.append(ev)
        if ev.kind == "done":
            record = orch.turn_record(rid)
    return events, record
