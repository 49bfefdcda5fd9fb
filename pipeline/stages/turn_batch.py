"""Base of the stage workers that batch whole turns from one queue (the speech encoders)."""

from __future__ import annotations

from omniduplex.pipeline.messages import StageMessage
from omniduplex.pipeline.stages.contract import BatchGauges


class TurnBatching(BatchGauges):
    """A worker whose turns wait whole in ``self.pending`` and go at most ``self.max_batch`` a step."""

    pending: list[StageMessage]

    def abort(self, request_id: str) -> None:
        """Drop the waiting turn ``request_id`` (nothing if it is not waiting)."""
        self.pending = [m for m in self.pending if m.request_id != request_id]

    def has_work(self) -> bool:
        return bool(self.pending)

    def take_batch(self) -> list[StageMessage]:
        """Remove and return the first ``max_batch`` waiting turns, in arrival order."""
        batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
        return batch
