"""Model registry: ``config.json`` ``architectures`` → our modules, loaded from the published tensor names.

Model families by registration: one :class:`ModelFamily` per family, declared once with
:func:`register_model_family`; :func:`load_model`, :func:`build_modules`, ``init-model --arch`` and the
graph shape / output rate of ``pipeline/topology.py`` (``serve --model``, ``respond``) read it. Built in
(registered at the end of this module): ``qwen3-omni`` (``Qwen3OmniMoeForConditionalGeneration``: Thinker +
audio tower, Talker + code predictor, Code2Wav), ``text-lm`` (``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``
/ ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``: a Thinker without audio; Llama and Qwen2 have no per-head
q/k norm, Qwen2 has q/k/v biases) and ``unified`` (``OmniduplexUnifiedLM``, :mod:`.unified`: one
delay-pattern speech LM + a DAC codec decoder under ``codec.``). A ``--plugin`` module registers more.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
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


@dataclass(frozen=True)
class ModelFamily:
    """One model family's declaration, made once with :func:`register_model_family`: every reader of a
    checkpoint (:func:`load_model`, :func:`build_modules`, ``init-model --arch NAME``, the graph shape and
    output rate that ``serve --model`` / ``respond`` pick in ``pipeline/topology.py``) looks it up here.

    Attributes:
        name: the family's name (``init-model --arch NAME``).
        architectures: the ``config.json`` ``architectures[0]`` values it reads.
        build: ``(raw_config, architecture) -> {prefix: module}``: freshly initialised modules keyed by their
            checkpoint tensor-name prefix (``""``: the whole checkpoint).
        load: ``(raw_config, architecture, files, parts, model_dir) -> LoadedModel``: the requested
            ``parts`` filled from the safetensors ``files`` (raises ``CheckpointError`` / ``ConfigError``).
        build_random: the same for a weightless directory (``random_weights.json``), modules left unfilled
            (:func:`load_model` seeds them); ``None``: not supported.
        shape: the name of the graph shape it is served on (a ``pipeline.topology.Topology.name``).
        output_rate: ``raw_config -> Hz`` of the PCM its graph emits (``None``: 24 kHz, Code2Wav's).
        init: ``(out, preset, seed, **options) -> None`` writing a deterministic random-weight preset
            (``init-model``; ``options``: ``text_only``), or its ``"module:function"`` path (imported when
            used: a presets module that builds through this registry); ``None``: the family has no presets.
    """

    name: str
    architectures: tuple[str, ...]
    build: Callable[[dict, str], dict[str, nn.Module]]
    load: Callable[[dict, str, list, tuple[str, ...], Path], LoadedModel]
    build_random: Callable[[dict, str, tuple[str, ...], Path], LoadedModel] | None = None
    shape: str = "qwen3-omni"
    output_rate: Callable[[dict], int] | None = None
    init: Callable[..., None] | str | None = None

    def write_preset(self, out: Path, preset: str, seed: int, **options) -> None:
        """Run :attr:`init` (``init-model --arch NAME``).

        Raises:
            ValueError: the family has no presets, or (from ``init``) an unknown preset."""
        fn = self.init
        if fn is None:
            raise ValueError(f"model family {self.name} has no presets")
        if isinstance(fn, str):
            module, _, name = fn.partition(":")
            fn = getattr(importlib.import_module(module), name)
        fn(out, preset, seed, **options)


_BY_NAME: dict[str, ModelFamily] = {}
_BY_ARCHITECTURE: dict[str, ModelFamily] = {}


def register_model_family(family: ModelFamily) -> ModelFamily:
    """Make ``family`` known to every reader of checkpoints (registering a name again replaces it, so
    re-importing a plugin module is harmless); returns it. A family outside the package registers from a
    ``--plugin`` module (stage processes import it too)."""
    old = _BY_NAME.pop(family.name, None)
    for arch in old.architectures if old else ():
        _BY_ARCHITECTURE.pop(arch, None)
    _BY_NAME[family.name] = family
    _BY_ARCHITECTURE.update(dict.fromkeys(family.architectures, family))
    return family


def model_families() -> list[ModelFamily]:
    """Every registered model family, in registration order."""
    return list(_BY_NAME.values())


def model_family_named(name: str) -> ModelFamily | None:
    """The family registered as ``name`` (``init-model --arch``), else ``None``."""
    return _BY_NAME.get(name)


def model_family_of(architecture: str) -> ModelFamily | None:
    """The family that reads ``config.json`` ``architectures[0] == architecture``, else ``None``."""
    return _BY_ARCHITECTURE.get(architecture)


def architecture_of(raw: dict, model_dir: Path | str) -> str:
    """The checkpoint's architecture name.

    Raises:
        CheckpointError: missing or unsupported ``architectures`` (the supported ones listed).
    """
    archs = raw.get("architectures") or []
    if not archs:
        raise CheckpointError(f"{model_dir}/config.json has no 'architectures' entry")
    arch = archs[0]
    if arch not in _BY_ARCHITECTURE:
        raise CheckpointError(
            f"unknown architecture '{arch}' in {model_dir}/config.json; "
            f"supported: {', '.join(_BY_ARCHITECTURE)}"
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
    return _BY_ARCHITECTURE[arch].build(raw, arch)


def load_model(
    model_dir: str | Path,
    parts: tuple[str, ...] = PARTS,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Build and load the requested parts of a checkpoint of any registered family.

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
    family = _BY_ARCHITECTURE[arch]
    seed = random_seed(model_dir)
    try:
        if seed is not None:  # weightless directory (``real`` presets): built on the device, filled in place
            if family.build_random is None:
                raise CheckpointError(
                    f"{model_dir}: a weightless (random_weights.json) {family.name} model is not supported"
                )
            with building_on(device, dtype):
                out = family.build_random(raw, arch, parts, model_dir)
            for i, name in enumerate(("thinker", "talker", "code2wav")):
                m = getattr(out, name)
                if m is not None:
                    random_init_(m, seed + i)
                    m.eval().requires_grad_(False)
            out.load_seconds = time.perf_counter() - t0
            return out
        out = family.load(raw, arch, weight_files(model_dir), parts, model_dir)
    except ConfigError as e:
        raise CheckpointError(f"{model_dir}/config.json: {e}") from e
    for name in ("thinker", "talker", "code2wav", "unified", "codec", "codec_encoder"):
        m: nn.Module | None = getattr(out, name)
        if m is not None:
            m.to(device=device, dtype=dtype).eval().requires_grad_(False)
    out.load_seconds = time.perf_counter() - t0
    return out


# -- the built-in families ---------------------------------------------------------------------------------
def _build_text(raw: dict, arch: str) -> dict[str, nn.Module]:
    return {"": DecoderLM(text_config(raw, arch))}


def _load_text(raw: dict, arch: str, files, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
    thinker = DecoderLM(text_config(raw, arch))
    load_state_dict_into(thinker, files, prefix="")
    return LoadedModel(arch, model_dir, raw, None, thinker=thinker, parts=("thinker",))


def _random_text(raw: dict, arch: str, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
    thinker = DecoderLM(text_config(raw, arch))
    return LoadedModel(arch, model_dir, raw, None, thinker=thinker, parts=("thinker",))


def _build_omni(raw: dict, arch: str) -> dict[str, nn.Module]:
    cfg = OmniConfig.from_dict(raw)
    tower = AudioEncoder(AudioEncoderConfig.from_dict(cfg.thinker.audio))
    mods: dict[str, nn.Module] = {"thinker.": DecoderLM(cfg.thinker.text, tower, cfg.thinker.audio_token_id)}
    if cfg.talker is not None and cfg.code2wav is not None:
        mods["talker."] = Talker(cfg.talker)
        mods["code2wav."] = Code2Wav(Code2WavConfig.from_dict(cfg.code2wav))
    return mods


def _random_omni(raw: dict, arch: str, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
    cfg = OmniConfig.from_dict(raw)
    out = LoadedModel(OMNI, model_dir, raw, cfg, parts=parts)
    if "thinker" in parts or "audio_tower" in parts:
        audio = cfg.thinker.audio
        tower = AudioEncoder(AudioEncoderConfig.from_dict(audio)) if "audio_tower" in parts else None
        out.thinker = DecoderLM(cfg.thinker.text, tower, cfg.thinker.audio_token_id)
        if "thinker" not in parts:
            out.thinker.model = out.thinker.lm_head = None
    if "talker" in parts:
        out.talker = Talker(cfg.talker)
    if "code2wav" in parts:
        out.code2wav = Code2Wav(Code2WavConfig.from_dict(cfg.code2wav))
    return out


def _build_unified(raw: dict, arch: str) -> dict[str, nn.Module]:
    cfg = UnifiedConfig.from_dict(raw)
    return {"": UnifiedLM(cfg), "codec.": DacCodec(DacDecoderConfig.from_dict(cfg.codec_config))}


def _load_omni(raw: dict, arch: str, files, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
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


def _load_unified(raw: dict, arch: str, files, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
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


def _unified_rate(raw: dict) -> int:
    """The DAC codec's ``codec_config.sampling_rate`` (Hz)."""
    return int((raw.get("codec_config") or {}).get("sampling_rate", 16000))


register_model_family(ModelFamily("qwen3-omni", (OMNI,), _build_omni, _load_omni, _random_omni,
                                  init="omniduplex.models.qwen3_omni.presets:write_checkpoint"))
register_model_family(ModelFamily("text-lm", TEXT_ARCHITECTURES, _build_text, _load_text, _random_text))
register_model_family(ModelFamily(
    "unified", (UNIFIED,), _build_unified, _load_unified, shape="unified", output_rate=_unified_rate,
    init="omniduplex.models.unified.presets:write_unified_checkpoint",
))
