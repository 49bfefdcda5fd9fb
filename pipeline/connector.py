"""Connector chunking between a codec LM and its vocoder: how many frames the vocoder stage gathers
before it decodes them.

Knobs (``ChunkingConfig``): ``initial_codec_chunk_frames`` (small first push → low time to first audio
packet), ``codec_chunk_frames`` (steady cadence: fewer, larger pushes cost less per frame). The vocoder
keeps per-layer decoder state, so no frame is decoded twice whatever the sizes
(:mod:`.stages.vocoder`). At 12.5 frames/s (Qwen3-Omni codec) 1 frame = 80 ms of audio; at the 44.1 kHz
DAC of the unified presets, 11.6 ms.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ChunkingConfig(BaseModel):
    """Codec LM → vocoder chunking knobs, in codec frames."""

    model_config = {"extra": "forbid"}

    initial_codec_chunk_frames: int = Field(2, ge=1)
    codec_chunk_frames: int = Field(8, ge=1)
