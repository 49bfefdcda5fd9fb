"""Loading a Higgs Audio v3 checkpoint folder by published tensor name.

Layout: ``config.json`` (``HiggsMultimodalQwen3ForConditionalGeneration``) + ``model.safetensors`` (or a
sharded index) with the talker's ``tied.*`` / ``body.*`` tensors (:mod:`.talker`); ``tokenizer.json``;
``audio_tokenizer/`` holding the codec named by ``config.audio_tokenizer_id`` (``bosonai/higgs-audio-v2-
tokenizer``: ``config.json`` + safetensors in ``transformers``' ``HiggsAudioV2TokenizerModel`` layout); an
optional ``voices.json`` (:mod:`.prompt`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from omniduplex.models.checkpoint import (
    CheckpointError,
    LoadedParts,
    config_architecture,
    load_state_dict_into,
    read_config,
    weight_files,
)
from omniduplex.models.config import ConfigError
from omniduplex.models.higgs.codec import HiggsCodecDecoder, load_codec
from omniduplex.models.higgs.config import (
    ARCHITECTURE,
    CODEC_DIR,
    CODEC_MODEL_TYPE,
    HiggsCodecConfig,
    HiggsConfig,
)
from omniduplex.models.higgs.prompt import VOICES_FILE, PromptError, Voice, load_voices
from omniduplex.models.higgs.talker import HiggsTalker
from omniduplex.models.tokenizer import load_tokenizer

PARTS = ("talker", "codec")
UNUSED_PREFIXES = ("tied.head.text_head.", "tied.embedding.modality_embeddings.0.model.")
"""Published tensors the speech path never reads: the text head and the codec bundled in the main file
(the codec loads from ``audio_tokenizer/``)."""


@dataclass
class Higgs(LoadedParts, parts=PARTS):
    """The loaded parts of one checkpoint (``None`` where not asked for)."""

    path: Path
    config: HiggsConfig
    codec_config: HiggsCodecConfig | None
    tokenizer: Tokenizer | None
    voices: dict[str, Voice]
    talker: HiggsTalker | None = None
    codec: HiggsCodecDecoder | None = None


def is_higgs(model_dir: str | Path) -> bool:
    """Whether ``model_dir/config.json`` names :data:`ARCHITECTURE` (False for an unreadable config)."""
    return config_architecture(model_dir) == ARCHITECTURE


def read_codec_config(model_dir: str | Path) -> HiggsCodecConfig:
    """``audio_tokenizer/config.json`` as :class:`HiggsCodecConfig`.

    Raises:
        CheckpointError: missing, not a ``higgs_audio_v2_tokenizer`` config, or unsupported.
    """
    raw = read_config(Path(model_dir) / CODEC_DIR)
    if raw.get("model_type") != CODEC_MODEL_TYPE:
        raise CheckpointError(
            f"{model_dir}/{CODEC_DIR}: model_type {raw.get('model_type')!r} is not {CODEC_MODEL_TYPE}"
        )
    try:
        return HiggsCodecConfig.from_dict(raw)
    except ConfigError as e:
        raise CheckpointError(f"{model_dir}/{CODEC_DIR}: {e}") from e


def load_higgs(
    model_dir: str | Path,
    parts: tuple[str, ...] = PARTS,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Higgs:
    """Build and load the requested parts (the codec always in fp32: it is small and its output is PCM).

    Raises:
        CheckpointError: not a Higgs v3 checkpoint, a config our modules do not support, unreadable files,
            a missing / mis-shaped / unexpected tensor (the message names it), or a bad ``voices.json``.
    """
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    raw = read_config(model_dir)
    arch = (raw.get("architectures") or [None])[0]
    if arch != ARCHITECTURE:
        raise CheckpointError(f"{model_dir}/config.json: architecture {arch!r} is not {ARCHITECTURE}")
    try:
        cfg = HiggsConfig.from_dict(raw)
    except ConfigError as e:
        raise CheckpointError(f"{model_dir}: {e}") from e
    codec_cfg = read_codec_config(model_dir) if "codec" in parts else None
    if codec_cfg is not None and (
        codec_cfg.num_quantizers < cfg.num_codebooks or codec_cfg.codebook_size != cfg.codebook_size
    ):
        raise CheckpointError(
            f"{model_dir}: the talker's {cfg.num_codebooks} codebooks of {cfg.codebook_size} codes do not "
            "fit the "
            f"codec's {codec_cfg.num_quantizers} quantizers of {codec_cfg.codebook_size}"
        )
    tok = load_tokenizer(model_dir) if (model_dir / "tokenizer.json").is_file() else None
    try:
        voices = load_voices(model_dir, cfg)
    except (PromptError, KeyError, ValueError) as e:
        raise CheckpointError(f"{model_dir}/{VOICES_FILE}: {e}") from e
    out = Higgs(model_dir, cfg, codec_cfg, tok, voices, parts=parts)
    if "talker" in parts:
        out.talker = HiggsTalker(cfg)
        ignore = UNUSED_PREFIXES + (("tied.head.modality_heads.0.",) if cfg.tie_audio_embeddings else ())
        load_state_dict_into(out.talker, weight_files(model_dir), ignore=ignore)
        out.talker.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if codec_cfg is not None:
        out.codec = HiggsCodecDecoder(codec_cfg)
        load_codec(out.codec, weight_files(model_dir / CODEC_DIR))
        out.codec.to(device=device).eval().requires_grad_(False)
    out.load_seconds = time.perf_counter() - t0
    return out
