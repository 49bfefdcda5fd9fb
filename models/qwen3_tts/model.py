"""Loading a Qwen3-TTS checkpoint in the published layout, by tensor name.

Layout (Qwen/Qwen3-TTS-12Hz-{0.6B,1.7B}-{Base,CustomVoice,VoiceDesign}): ``config.json``
(``Qwen3TTSForConditionalGeneration``) + ``model.safetensors`` with ``talker.*`` and, for Base,
``speaker_encoder.*``; ``speech_tokenizer/config.json`` (``Qwen3TTSTokenizerV2Model``) +
``speech_tokenizer/model.safetensors`` with ``decoder.*`` and ``encoder.*`` (the Mimi-based codec encoder,
for in-context cloning; loaded when the config has an ``encoder_config``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from omniduplex.models.checkpoint import (
    CheckpointError,
    LoadedParts,
    config_architecture,
    load_state_dict_into,
    read_config,
    weight_files,
)
from omniduplex.models.config import ConfigError
from omniduplex.models.qwen3_tts.codec import CodecDecoder
from omniduplex.models.qwen3_tts.codec_encoder import CodecEncoder, CodecEncoderConfig
from omniduplex.models.qwen3_tts.config import (
    ARCHITECTURE,
    CODEC_ARCHITECTURE,
    CodecDecoderConfig,
    TTSConfig,
)
from omniduplex.models.qwen3_tts.speaker_encoder import SpeakerEncoder
from omniduplex.models.qwen3_tts.talker import Talker
from omniduplex.models.random_init import building_on, random_init_, random_seed

CODEC_DIR = "speech_tokenizer"
PARTS = ("talker", "speaker_encoder", "codec", "codec_encoder")
SAMPLE_RATE = 24000
"""Output and speaker-encoder input rate (Hz) of the 12 Hz family."""


@dataclass
class Qwen3TTS(LoadedParts, parts=PARTS):
    """The loaded parts of one checkpoint (a part is ``None`` when not asked for or, for the speaker encoder,
    when the variant has none)."""

    path: Path
    config: TTSConfig
    raw_config: dict
    codec_config: CodecDecoderConfig | None
    talker: Talker | None = None
    speaker_encoder: SpeakerEncoder | None = None
    codec: CodecDecoder | None = None
    codec_encoder: CodecEncoder | None = None


def is_qwen3_tts(model_dir: str | Path) -> bool:
    """Whether ``model_dir/config.json`` names :data:`ARCHITECTURE` (False for an unreadable config)."""
    return config_architecture(model_dir) == ARCHITECTURE


def build_modules(raw: dict, codec_raw: dict | None) -> dict[str, torch.nn.Module]:
    """Fresh modules keyed by checkpoint prefix: ``talker.``, ``speaker_encoder.`` (Base) and, with
    ``codec_raw``, ``speech_tokenizer/decoder.`` (the prefix names the file and the tensor prefix)."""
    cfg = TTSConfig.from_dict(raw)
    mods: dict[str, torch.nn.Module] = {"talker.": Talker(cfg)}
    if cfg.speaker_encoder is not None:
        mods["speaker_encoder."] = SpeakerEncoder(cfg.speaker_encoder)
    if codec_raw is not None:
        mods[f"{CODEC_DIR}/decoder."] = CodecDecoder(
            CodecDecoderConfig.from_dict(codec_raw["decoder_config"])
        )
        if codec_raw.get("encoder_config"):
            mods[f"{CODEC_DIR}/encoder."] = CodecEncoder(_encoder_config(codec_raw))
    return mods


def _encoder_config(codec_raw: dict) -> CodecEncoderConfig:
    return CodecEncoderConfig.from_dict(
        codec_raw["encoder_config"], int(codec_raw.get("encoder_valid_num_quantizers", 16))
    )


def load_qwen3_tts(
    model_dir: str | Path,
    parts: tuple[str, ...] = PARTS,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Qwen3TTS:
    """Build and load the requested parts.

    Raises:
        CheckpointError: not a Qwen3-TTS checkpoint, a config our modules do not support, unreadable
            files, or missing / mis-shaped / unexpected tensors.
    """
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    raw = read_config(model_dir)
    arch = (raw.get("architectures") or [None])[0]
    if arch != ARCHITECTURE:
        raise CheckpointError(f"{model_dir}/config.json: architecture {arch!r} is not {ARCHITECTURE}")
    codec_raw = None
    try:
        cfg = TTSConfig.from_dict(raw)
        codec_cfg = enc_cfg = None
        if "codec" in parts or "codec_encoder" in parts:
            codec_raw = read_config(model_dir / CODEC_DIR)
            codec_arch = (codec_raw.get("architectures") or [None])[0]
            if codec_arch != CODEC_ARCHITECTURE:
                raise CheckpointError(
                    f"{model_dir / CODEC_DIR}/config.json: architecture {codec_arch!r} is not "
                    f"{CODEC_ARCHITECTURE}"
                )
            if "codec" in parts:
                codec_cfg = CodecDecoderConfig.from_dict(codec_raw.get("decoder_config") or {})
            if "codec_encoder" in parts and codec_raw.get("encoder_config"):
                enc_cfg = _encoder_config(codec_raw)
    except ConfigError as e:
        raise CheckpointError(f"{model_dir}: {e}") from e
    out = Qwen3TTS(model_dir, cfg, raw, codec_cfg, parts=parts)
    seed = random_seed(model_dir)
    if seed is not None:  # weightless directory (``real`` presets): built on the device, filled in place
        with building_on(device, dtype):
            out.talker = Talker(cfg) if "talker" in parts else None
            out.codec = CodecDecoder(codec_cfg) if codec_cfg is not None else None
        for i, m in enumerate((out.talker, out.codec)):
            if m is not None:
                random_init_(m, seed + i)
                m.eval().requires_grad_(False)
        out.load_seconds = time.perf_counter() - t0
        return out
    files = weight_files(model_dir)
    if "talker" in parts:
        out.talker = Talker(cfg)
        load_state_dict_into(out.talker, files, prefix="talker.")
    if "speaker_encoder" in parts and cfg.speaker_encoder is not None:
        out.speaker_encoder = SpeakerEncoder(cfg.speaker_encoder)
        load_state_dict_into(out.speaker_encoder, files, prefix="speaker_encoder.")
    if codec_cfg is not None:
        out.codec = CodecDecoder(codec_cfg)
        load_state_dict_into(
            out.codec, weight_files(model_dir / CODEC_DIR), prefix="decoder.", ignore=("encoder.",)
        )
    if enc_cfg is not None:
        out.codec_encoder = CodecEncoder(enc_cfg)
        load_state_dict_into(
            out.codec_encoder, weight_files(model_dir / CODEC_DIR), prefix="encoder.", ignore=("decoder.",)
        )
    for name in PARTS:
        m = getattr(out, name)
        if m is not None:
            m.to(device=device, dtype=dtype).eval().requires_grad_(False)
    out.load_seconds = time.perf_counter() - t0
    return out
