"""Chunking between a codec LM and its vocoder: how many frames the vocoder stage gathers
before it decodes them.

Knobs (``ChunkingConfig``): ``initial_codec_chunk_frames`` (small first push → low time to first audio
packet), ``codec_chunk_frames`` (steady cadence: fewer, larger pushes cost less per frame). The vocoder
keeps per-layer decoder state, so no frame is decoded twice whatever the sizes
(:mod:`.stages.vocoder`). At 12.5 frames/s (Qwen3-Omni codec) 1 frame = 80 ms of audio; at the 44.1 kHz
DAC of the unified presets, 11.6 ms. Qwen3-TTS reads its own pair (``tts_first_chunk_frames``,
``tts_chunk_frames``): the codec stage of its graph, and the cascade's TTS stage that holds talker and
decoder in one.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from omniduplex.models.qwen3_tts.codec import STREAM_CHUNK, STREAM_FIRST_CHUNK


class ChunkingConfig(BaseModel):
    """Codec LM → vocoder chunking knobs, in codec frames."""

    model_config = {"extra": "forbid"}

    initial_codec_chunk_frames: int = Field(2, ge=1)
    codec_chunk_frames: int = Field(8, ge=1)
    tts_first_chunk_frames: int = Field(STREAM_FIRST_CHUNK, ge=1)
    """Qwen3-TTS (its graph's codec stage, the cascade's TTS stage): frames of the first waveform piece
    (vLLM-Omni's 1)."""
    tts_chunk_frames: int = Field(STREAM_CHUNK, ge=1)
    """Qwen3-TTS: frames of each later piece (vLLM-Omni's 25)."""
