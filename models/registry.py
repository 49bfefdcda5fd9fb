"""Model registry: ``config.json`` ``architectures`` → our modules, loaded from the published tensor names.

Supported: ``Qwen3OmniMoeForConditionalGeneration`` (Thinker + audio tower, Talker + code predictor,
Code2Wav), the text LMs ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` / ``LlamaForCausalLM`` /
``Qwen2ForCausalLM`` (a Thinker without audio; Llama and Qwen2 have no per-head q/k norm, Qwen2 has
q/k/v biases), and
``OmniduplexUnifiedLM`` (:mod:`.unified`: one delay-pattern speech LM + a DAC codec decoder under ``codec.``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from omniduplex.models.checkpoint import (
    CheckpointError,
    load_state_dict_into,
    parameter_counts,
    read_config,
    weight_files,
)
from omniduplex.models.codecs.dac import DacCodec, DacDecoderConfig, load_codec_into
from omniduplex.models.codecs.dac_encoder import DacCodecEncoder, DacEncoderConfig, load_codec_encoder_into
from omniduplex.models.config import ConfigError, DecoderConfig, OmniConfig
from omniduplex.models.decoder_lm import DecoderLM
from omniduplex.models.qwen3_omni.audio_encoder import AudioEncoder, AudioEncoderConfig
from omniduplex.models.qwen3_omni.code2wav import Code2Wav
from omniduplex.models.qwen3_omni.code2wav_config import Code2WavConfig
from omniduplex.models.qwen3_omni.talker import Talker
from omniduplex.models.random_init import building_on, random_init_, random_seed
from omniduplex.models.unified.model import ARCHITECTURE as UNIFIED
from omniduplex.models.unified.model import UnifiedConfig, UnifiedLM

OMNI = "Qwen3OmniMoeForConditionalGeneration"
TEXT_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM")
NO_QK_NORM = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})
"""Text architectures whose attention has no per-head q/k RMSNorm."""
PARTS = ("audio_tower", "thinker", "talker", "code2wav")


@dataclass
class LoadedModel:
    """The modules of one checkpoint (any of them ``None`` when not requested or not present).

    ``config`` is the parsed :class:`OmniConfig` (``None`` for a text LM); ``load_seconds`` is the wall
    time spent building and filling the modules.
    """

    architecture: str
    path: Path
    raw_config: dict
    config: OmniConfig | None
    thinker: DecoderLM | None = None
    talker: Talker | None = None
    code2wav: Code2Wav | None = None
    unified: UnifiedLM | None = None
    codec: DacCodec | None = None
    codec_encoder: DacCodecEncoder | None = None
    load_seconds: float = 0.0
    parts: tuple[str, ...] = field(default_factory=tuple)

    def num_parameters(self) -> dict[str, int]:
        """Parameter count per loaded part (tied weights counted once)."""
        return parameter_counts(self, ("thinker", "talker", "code2wav", "unified", "codec", "codec_encoder"))

    @property
    def unified_config(self) -> UnifiedConfig:
        """The parsed config of a unified checkpoint. Raises CheckpointError for other architectures."""
        if self.architecture != UNIFIED:
            raise CheckpointError(f"{self.path} is a {self.architecture} checkpoint, not {UNIFIED}")
        return UnifiedConfig.from_dict(self.raw_config)


def architecture_of(raw: dict, model_dir: Path | str) -> str:
    """The checkpoint's architecture name.

    Raises:
        CheckpointError: missing or unsupported ``architectures``.
    """
    archs = raw.get("architectures") or []
    if not archs:
        raise CheckpointError(f"{model_dir}/config.json has no 'architectures' entry")
    arch = archs[0]
    if arch not in (OMNI, UNIFIED) and arch not in TEXT_ARCHITECTURES:
        raise CheckpointError(
            f"unknown architecture '{arch}' in {model_dir}/config.json; supported: "
            f"{', '.join((OMNI, *TEXT_ARCHITECTURES, UNIFIED))}"
        )
    return arch


def text_config(raw: dict, arch: str) -> DecoderConfig:
    """The decoder config of a text-LM checkpoint; ``qk_norm`` follows from the architecture.

    Raises:
        ConfigError: see :meth:`DecoderConfig.from_dict`.
    """
    extra = {"qkv_bias": True, "attention_bias": False} if arch == "Qwen2ForCausalLM" else {}
    return DecoderConfig.from_dict(raw, qk_norm=arch not in NO_QK_NORM, **extra)


def build_modules(raw: dict) -> dict[str, nn.Module]:
    """Freshly initialised modules for a config dict, keyed by their checkpoint name prefix."""
    arch = architecture_of(raw, "<config>")
    if arch == UNIFIED:
        cfg = UnifiedConfig.from_dict(raw)
        return {"": UnifiedLM(cfg), "codec.": DacCodec(DacDecoderConfig.from_dict(cfg.codec_config))}
    if arch != OMNI:
        return {"": DecoderLM(text_config(raw, arch))}
    cfg = OmniConfig.from_dict(raw)
    tower = AudioEncoder(AudioEncoderConfig.from_dict(cfg.thinker.audio))
    mods: dict[str, nn.Module] = {"thinker.": DecoderLM(cfg.thinker.text, tower, cfg.thinker.audio_token_id)}
    if cfg.talker is not None and cfg.code2wav is not None:
        mods["talker."] = Talker(cfg.talker)
        mods["code2wav."] = Code2Wav(Code2WavConfig.from_dict(cfg.code2wav))
    return mods


def load_model(
    model_dir: str | Path,
    parts: tuple[str, ...] = PARTS,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Build and load the requested parts of a checkpoint.

    Args:
        model_dir: directory with ``config.json`` and safetensors weights.
        parts: subset of ``("audio_tower", "thinker", "talker", "code2wav")``; a stage process asks only
            for what it runs ("thinker" without "audio_tower" loads the text model alone). For a unified
            checkpoint "thinker"/"unified" load the LM into ``unified``, "code2wav"/"codec" the codec
            decoder, "audio_tower"/"codec_encoder" the codec encoder (speech input).
        dtype: parameter dtype (fp32 for parity, bf16 for serving).

    Raises:
        CheckpointError: unknown architecture, unreadable/truncated files, missing or mis-shaped tensors,
            or a config that contradicts the weights.
    """
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    raw = read_config(model_dir)
    arch = architecture_of(raw, model_dir)
    seed = random_seed(model_dir)
    if seed is not None:  # weightless directory (``real`` presets): built on the device, filled in place
        try:
            with building_on(device, dtype):
                out = _build_random(raw, arch, parts, model_dir, seed)
        except ConfigError as e:
            raise CheckpointError(f"{model_dir}/config.json: {e}") from e
        out.load_seconds = time.perf_counter() - t0
        return out
    files = weight_files(model_dir)
    try:
        if arch == OMNI:
            out = _load_omni(raw, files, parts, model_dir)
        elif arch == UNIFIED:
            out = _load_unified(raw, files, parts, model_dir)
        else:
            thinker = DecoderLM(text_config(raw, arch))
            load_state_dict_into(thinker, files, prefix="")
            out = LoadedModel(arch, model_dir, raw, None, thinker=thinker, parts=("thinker",))
    except ConfigError as e:
        raise CheckpointError(f"{model_dir}/config.json: {e}") from e
    for name in ("thinker", "talker", "code2wav", "unified", "codec", "codec_encoder"):
        m: nn.Module | None = getattr(out, name)
        if m is not None:
            m.to(device=device, dtype=dtype).eval().requires_grad_(False)
    out.load_seconds = time.perf_counter() - t0
    return out


def _build_random(raw: dict, arch: str, parts: tuple[str, ...], model_dir: Path, seed: int) -> LoadedModel:
    """The requested parts of a weightless directory, random weights (see :mod:`.random_init`)."""
    if arch == UNIFIED:
        raise CheckpointError(
            f"{model_dir}: a weightless (random_weights.json) unified model is not supported"
        )
    if arch != OMNI:
        out = LoadedModel(
            arch, model_dir, raw, None, thinker=DecoderLM(text_config(raw, arch)), parts=("thinker",)
        )
    else:
        cfg = OmniConfig.from_dict(raw)
        out = LoadedModel(OMNI, model_dir, raw, cfg, parts=parts)
        if "thinker" in parts or "audio_tower" in parts:
            tower = (
                AudioEncoder(AudioEncoderConfig.from_dict(cfg.thinker.audio))
                if "audio_tower" in parts
                else None
            )
            out.thinker = DecoderLM(cfg.thinker.text, tower, cfg.thinker.audio_token_id)
            if "thinker" not in parts:
                out.thinker.model = out.thinker.lm_head = None
        if "talker" in parts:
            out.talker = Talker(cfg.talker)
        if "code2wav" in parts:
            out.code2wav = Code2Wav(Code2WavConfig.from_dict(cfg.code2wav))
    for i, name in enumerate(("thinker", "talker", "code2wav")):
        m = getattr(out, name)
        if m is not None:
            random_init_(m, seed + i)
            m.eval().requires_grad_(False)
    return out


def _load_omni(raw: dict, files, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
    cfg = OmniConfig.from_dict(raw)
    out = LoadedModel(OMNI, model_dir, raw, cfg, parts=parts)
    if "thinker" in parts or "audio_tower" in parts:
        tower = (
            AudioEncoder(AudioEncoderConfig.from_dict(cfg.thinker.audio)) if "audio_tower" in parts else None
        )
        out.thinker = DecoderLM(cfg.thinker.text, tower, cfg.thinker.audio_token_id)
        if "thinker" in parts:
            load_state_dict_into(
                out.thinker,
                files,
                prefix="thinker.",
                ignore=("thinker.visual.",) + (() if tower else ("thinker.audio_tower.",)),
            )
        else:  # audio tower only (encoder stage): skip the LLM weights entirely
            out.thinker.model = None
            out.thinker.lm_head = None
            load_state_dict_into(tower, files, prefix="thinker.audio_tower.")
    if ("talker" in parts or "code2wav" in parts) and (cfg.talker is None or cfg.code2wav is None):
        raise CheckpointError(f"{model_dir}: checkpoint has no talker/code2wav (enable_audio_output is off)")
    if "talker" in parts:
        out.talker = Talker(cfg.talker)
        load_state_dict_into(out.talker, files, prefix="talker.")
    if "code2wav" in parts:
        out.code2wav = Code2Wav(Code2WavConfig.from_dict(cfg.code2wav))
        load_state_dict_into(out.code2wav, files, prefix="code2wav.")
    return out


def _load_unified(raw: dict, files, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
    cfg = UnifiedConfig.from_dict(raw)
    out = LoadedModel(UNIFIED, model_dir, raw, None, parts=parts)
    if "thinker" in parts or "unified" in parts:
        out.unified = UnifiedLM(cfg)
        load_state_dict_into(out.unified, files, prefix="", ignore=("codec.",))
    if "code2wav" in parts or "codec" in parts:
        if not cfg.codec_config:
            raise CheckpointError(f"{model_dir}/config.json: unified checkpoint has no codec_config")
        out.codec = DacCodec(DacDecoderConfig.from_dict(cfg.codec_config))
        load_codec_into(out.codec, files, prefix="codec.")
    if "audio_tower" in parts or "codec_encoder" in parts:
        if not cfg.codec_config:
            raise CheckpointError(f"{model_dir}/config.json: unified checkpoint has no codec_config")
        out.codec_encoder = DacCodecEncoder(DacEncoderConfig.from_dict(cfg.codec_config))
        load_codec_encoder_into(out.codec_encoder, files, prefix="codec.")
    return out
