"""Connector chunking between a codec LM and its vocoder: when to decode, which windows, and the per-request
frame buffer both vocoder stages (Code2Wav, DAC) keep.

Knobs (``ChunkingConfig``): ``initial_codec_chunk_frames`` (small first chunk → low time to first
audio packet), ``codec_chunk_frames`` (steady cadence), ``decode_chunk_frames`` (largest Code2Wav
window), ``decode_left_context_frames`` (frames re-read before each window so boundaries are seamless).
At 12.5 frames/s (Qwen3-Omni codec), 1 frame = 80 ms of audio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, Field


class ChunkingConfig(BaseModel):
    """Talker → Code2Wav chunking knobs, in codec frames."""

    model_config = {"extra": "forbid"}

    initial_codec_chunk_frames: int = Field(2, ge=1)
    codec_chunk_frames: int = Field(8, ge=1)
    decode_chunk_frames: int = Field(32, ge=1)
    decode_left_context_frames: int = Field(25, ge=0)


def frames_to_decode(available: int, emitted: int, finished: bool, cfg: ChunkingConfig) -> int:
    """How many new frames to decode now; 0 means wait for more.

    The first chunk goes out once ``initial_codec_chunk_frames`` are buffered, later ones every
    ``codec_chunk_frames``; when the Talker has finished, whatever remains goes out at once.
    """
    pending = available - emitted
    if pending <= 0:
        return 0
    if finished:
        return pending
    need = cfg.initial_codec_chunk_frames if emitted == 0 else cfg.codec_chunk_frames
    return pending if pending >= need else 0


def decode_windows(start: int, end: int, cfg: ChunkingConfig) -> list[tuple[int, int]]:
    """Split frames ``[start, end)`` into windows of at most ``decode_chunk_frames``."""
    step = cfg.decode_chunk_frames
    return [(s, min(s + step, end)) for s in range(start, end, step)]


@dataclass
class FrameStream:
    """One request's codec frames at a vocoder stage: ``frames`` holds frames ``[offset, available)``
    (each int64 ``[G]``), ``emitted`` frames are decoded, ``finished`` once the last frame arrived."""

    frames: list[torch.Tensor] = field(default_factory=list)
    offset: int = 0
    emitted: int = 0
    finished: bool = False

    @property
    def available(self) -> int:
        return self.offset + len(self.frames)

    def codes(self, first: int, end: int) -> torch.Tensor:
        """Frames ``[first, end)`` as int64 ``[G, end − first]``; ``first >= offset``."""
        return torch.stack(self.frames[first - self.offset : end - self.offset], dim=1)

    def trim(self, left_context: int) -> None:
        """Drop frames no later window needs: all before ``emitted − left_context``."""
        drop = max(self.offset, self.emitted - left_context) - self.offset
        if drop > 0:
            del self.frames[:drop]
            self.offset += drop
