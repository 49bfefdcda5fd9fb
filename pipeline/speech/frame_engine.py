"""What the TTS engine wrappers share (:mod:`.qwen3_tts`, :mod:`.fish_speech`, :mod:`.higgs`): their requests
make one codec frame per engine step, reported as :class:`FrameEvent`s."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniduplex.pipeline.engine.engine import Engine


@dataclass
class FrameEvent:
    """One engine output of a request: ``codes`` int64 ``[G]`` (the frame this step completed, one id per
    codebook; ``None`` when it completed none, e.g. the closing step), ``finished`` with its
    ``finish_reason`` (``"stop"``, ``"length"``, ``"abort"``)."""

    request_id: str
    codes: torch.Tensor | None
    finished: bool
    finish_reason: str | None = None


class FrameEngine:
    """Base of an engine wrapper whose adapter puts each step's frame in the step extras (``"codes"``)."""

    engine: Engine

    def abort(self, request_id: str) -> bool:
        """Drop ``request_id`` (frees its KV blocks); ``False`` when unknown."""
        return self.engine.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    @torch.no_grad()
    def step(self) -> list[FrameEvent]:
        """One engine iteration: an event for every request that sampled (its frame, if one completed)."""
        out = []
        for o in self.engine.step():
            codes = o.extras.get("codes")
            codes = torch.tensor(codes, dtype=torch.int64) if codes is not None else None
            out.append(FrameEvent(o.request_id, codes, o.finished, o.finish_reason))
        return out
