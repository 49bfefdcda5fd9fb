"""Loading a Fish Speech S2 Pro checkpoint folder by published tensor name.

Layout: ``config.json`` (``model_type`` ``fish_qwen3_omni``) + ``model.safetensors`` (or a sharded index) with
``text_model.*`` and ``audio_decoder.*`` (:mod:`.model`), ``tokenizer.json``; the codec in ``codec/``
(``config.json``: a ``DacConfig`` dict, ``model.safetensors``: ``DacModel`` tensor names, decoder and
encoder).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from omniduplex.models.checkpoint import (
    CheckpointError,
    LoadedParts,
    config_value,
    read_config,
    weight_files,
)
from omniduplex.models.codecs.dac import DacCodec, DacDecoderConfig, load_codec_into
from omniduplex.models.codecs.dac_encoder import DacCodecEncoder, DacEncoderConfig, load_codec_encoder_into
from omniduplex.models.config import ConfigError
from omniduplex.models.fish_speech.config import CODEC_DIR, MODEL_TYPE, FishConfig, check_codec
from omniduplex.models.fish_speech.model import FishLM, load_fish_lm

PARTS = ("lm", "codec", "codec_encoder")


@dataclass
class FishSpeech(LoadedParts, parts=PARTS):
    """The loaded parts of one checkpoint (a part is ``None`` when not asked for)."""

    path: Path
    config: FishConfig
    raw_config: dict
    lm: FishLM | None = None
    codec: DacCodec | None = None
    codec_encoder: DacCodecEncoder | None = None


def is_fish_speech(model_dir: str | Path) -> bool:
    """Whether ``model_dir/config.json`` has ``model_type`` ``fish_qwen3_omni`` (False if unreadable)."""
    return config_value(model_dir, "model_type") == MODEL_TYPE


def load_fish_speech(
    model_dir: str | Path,
    parts: tuple[str, ...] = PARTS,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> FishSpeech:
    """Build and load the requested parts (``lm``: slow + fast AR; ``codec``: the DAC decoder;
    ``codec_encoder``: the DAC encoder, for reference clips). The codec parts stay in fp32.

    Raises:
        CheckpointError: not a Fish Speech checkpoint, a config our modules do not support, unreadable files,
            or missing / mis-shaped / unexpected tensors (the message names the tensor).
    """
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown parts {unknown}; choose from {list(PARTS)}")
    raw = read_config(model_dir)
    try:
        cfg = FishConfig.from_dict(raw)
        codec_raw = None
        if "codec" in parts or "codec_encoder" in parts:
            codec_raw = read_config(model_dir / CODEC_DIR)
            check_codec(cfg, codec_raw)
    except ConfigError as e:
        raise CheckpointError(f"{model_dir}: {e}") from e
    out = FishSpeech(model_dir, cfg, raw, parts=parts)
    if "lm" in parts:
        out.lm = FishLM(cfg)
        load_fish_lm(out.lm, weight_files(model_dir))
        out.lm.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if codec_raw is not None:
        files = weight_files(model_dir / CODEC_DIR)
        try:
            if "codec" in parts:
                out.codec = DacCodec(DacDecoderConfig.from_dict(codec_raw))
                load_codec_into(out.codec, files, prefix="")
            if "codec_encoder" in parts:
                out.codec_encoder = DacCodecEncoder(DacEncoderConfig.from_dict(codec_raw))
                load_codec_encoder_into(out.codec_encoder, files, prefix="")
        except ConfigError as e:
            raise CheckpointError(f"{model_dir / CODEC_DIR}: {e}") from e
        for m in (out.codec, out.codec_encoder):
            if m is not None:
                m.to(device=device).eval().requires_grad_(False)
    out.load_seconds = time.perf_counter() - t0
    return out
