"""What the TTS stages share on the way in: the turns aborted recently and the check of a text delta."""

from __future__ import annotations

from collections import OrderedDict

from omniduplex.pipeline.messages import DecoderOutput, StageMessage

ABORTED_MEMORY = 1024
"""How many aborted turn ids a TTS stage remembers (the oldest is forgotten first)."""


class AbortedTurns:
    """The last :data:`ABORTED_MEMORY` aborted turn ids: late text for them is dropped."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, request_id: str) -> None:
        self._ids[request_id] = None
        while len(self._ids) > ABORTED_MEMORY:
            self._ids.popitem(last=False)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids


def text_delta(msg: StageMessage, aborted: AbortedTurns) -> DecoderOutput | None:
    """``msg``'s :class:`DecoderOutput`, or ``None`` when its turn was aborted (the message is dropped).

    Raises ValueError: not a ``DecoderOutput`` (this turn only).
    """
    if msg.request_id in aborted:
        return None
    if not isinstance(msg.meta, DecoderOutput):
        raise ValueError(
            f"turn {msg.request_id}: the TTS stage takes DecoderOutput, got {type(msg.meta).__name__}"
        )
    return msg.meta
