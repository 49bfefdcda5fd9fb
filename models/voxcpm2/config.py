"""Typed view of a VoxCPM2 ``config.json`` (openbmb/VoxCPM2; read as ``voxcpm`` 2.0.3's ``VoxCPMConfig``).

Layout: ``architecture: "voxcpm2"``; ``lm_config`` (MiniCPM4: ``hidden_size``, ``num_hidden_layers``, ...,
``kv_channels`` (head size), ``rope_scaling`` (LongRoPE factors), ``use_mup``, ``scale_emb``, ``scale_depth``,
``dim_model_base``); ``patch_size`` (latent frames per LM step, 4), ``feat_dim`` (latent width, 64),
``scalar_quantization_latent_dim`` / ``_scale`` (the FSQ bottleneck), ``residual_lm_num_layers``,
``residual_lm_no_rope``; ``encoder_config`` / ``dit_config`` (``hidden_dim``, ``ffn_dim``, ``num_heads``,
``num_layers``, ``kv_channels``; the DiT's ``cfm_config``); ``audio_vae_config``; ``max_length``.

The four transformers (base LM, residual LM, local encoder, local DiT) are MiniCPM4 stacks: the encoder and
DiT copy ``lm_config`` and override width, FFN, heads, layers and ``kv_channels`` (``None``: ``hidden /
heads``), as ``VoxCPM2Model.__init__`` builds them; the residual LM copies it with its own depth and
``no_rope``. The published config sets ``use_mup: false``: no embedding scale and plain residuals
(``scale_emb`` / ``scale_depth`` are read only when ``use_mup`` is true; ``dim_model_base`` scales MiniCPM's
LM head, which VoxCPM2 does not have).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omniduplex.models.config import ConfigError, DecoderConfig

ARCHITECTURE = "voxcpm2"
AUDIO_START_ID, AUDIO_END_ID, REF_AUDIO_START_ID, REF_AUDIO_END_ID = 101, 102, 103, 104
"""Special text ids ``VoxCPM2Model`` hard-codes (``audio_start_token`` … ``ref_audio_end_token``)."""


@dataclass
class LongRope:
    """MiniCPM's LongRoPE (``rope_scaling``): frequency ``i`` divided by ``factor[i]``, cos/sin multiplied by
    ``sqrt(1 + ln(max / original) / ln(original))``; ``long_factor`` when ``max_position_embeddings`` exceeds
    ``original_max_position_embeddings``, else ``short_factor`` (the choice is made once, for the whole
    table, as ``MiniCPMLongRoPE`` does). Source: MiniCPM4 (OpenBMB), ``voxcpm/modules/minicpm4/model.py``."""

    factors: list[float]
    scaling: float

    @classmethod
    def from_dict(cls, d: dict[str, Any], max_pos: int, head_dim: int) -> LongRope:
        try:
            orig = int(d["original_max_position_embeddings"])
            factors = [float(f) for f in d["long_factor" if max_pos > orig else "short_factor"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"lm_config.rope_scaling is not a LongRoPE block ({e})") from e
        if len(factors) not in (1, head_dim // 2):  # one factor broadcasts over the frequencies
            raise ConfigError(
                f"lm_config.rope_scaling has {len(factors)} factors; head size {head_dim} needs "
                f"{head_dim // 2}"
            )
        return cls(factors, math.sqrt(1 + math.log(max_pos / orig) / math.log(orig)))


@dataclass
class Stack:
    """One MiniCPM4 stack: the shared :class:`DecoderConfig` (``qk_norm`` off, residual scale set) and its
    LongRoPE (``None`` with ``no_rope``)."""

    decoder: DecoderConfig
    rope: LongRope | None


@dataclass
class CfmConfig:
    """``dit_config.cfm_config`` fields used at inference, and the DiT's mean-velocity flag."""

    sigma_min: float = 1e-6
    solver: str = "euler"
    mean_mode: bool = False


@dataclass
class AudioVAEConfig:
    """``audio_vae_config`` (``AudioVAEConfig`` of ``voxcpm/modules/audiovae/audio_vae_v2.py``, defaults
    included): 16 kHz in, ``encoder_rates`` product samples per latent frame (640: 25 Hz); ``decoder_rates``
    product output samples per frame at ``out_sample_rate`` (1920 at 48 kHz)."""

    encoder_dim: int = 128
    encoder_rates: list[int] = field(default_factory=lambda: [2, 5, 8, 8])
    latent_dim: int | None = 64
    decoder_dim: int = 2048
    decoder_rates: list[int] = field(default_factory=lambda: [8, 6, 5, 2, 2, 2])
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: list[int] | None = field(default_factory=lambda: [20000, 30000, 40000])
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AudioVAEConfig:
        names = {f for f in cls.__dataclass_fields__}
        cfg = cls(**{k: v for k, v in (d or {}).items() if k in names})
        if cfg.latent_dim is None:
            cfg.latent_dim = cfg.encoder_dim * 2 ** len(cfg.encoder_rates)
        if cfg.use_noise_block:
            raise ConfigError(
                "audio_vae_config.use_noise_block=true is not supported (random noise in decode)"
            )
        if cfg.sr_bin_boundaries is not None and (
            cfg.cond_type not in ("scale_bias", "scale_bias_init", "add") or cfg.cond_out_layer
        ):
            raise ConfigError(
                f"audio_vae_config cond_type={cfg.cond_type!r} cond_out_layer={cfg.cond_out_layer} is not "
                "supported (scale_bias, scale_bias_init or add, no out layer)"
            )
        if cfg.decoder_dim % 2 ** len(cfg.decoder_rates):
            raise ConfigError("audio_vae_config.decoder_dim must halve once per decoder rate")
        return cfg

    @property
    def hop_length(self) -> int:
        """Input samples (16 kHz) per latent frame."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop(self) -> int:
        """Output samples (``out_sample_rate``) per latent frame."""
        return math.prod(self.decoder_rates)


@dataclass
class VoxCPM2Config:
    """The model-side fields of a VoxCPM2 ``config.json``."""

    lm: Stack
    residual: Stack
    encoder: Stack
    dit: Stack
    cfm: CfmConfig
    vae: AudioVAEConfig
    patch_size: int = 4
    feat_dim: int = 64
    fsq_latent_dim: int = 512
    fsq_scale: int = 9
    scale_emb: float = 1.0
    """Text embedding multiplier: ``lm_config.scale_emb`` when ``use_mup``, else 1."""
    max_length: int = 8192

    @property
    def hidden_size(self) -> int:
        return self.lm.decoder.hidden_size

    @property
    def context(self) -> int:
        """Positions one request may use (prompt rows + patches): the reference's KV cache length
        (``max_length``) within the rotary table (``max_position_embeddings``)."""
        return min(self.max_length, self.lm.decoder.max_position_embeddings)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VoxCPM2Config:
        """Raises ConfigError for a missing section or key, or parts that do not fit together."""
        if d.get("architecture") != ARCHITECTURE:
            raise ConfigError(f"architecture {d.get('architecture')!r} is not {ARCHITECTURE!r}")
        for key in ("lm_config", "encoder_config", "dit_config"):
            if not isinstance(d.get(key), dict):
                raise ConfigError(f"config.json has no {key}")
        lm = dict(d["lm_config"])
        use_mup = bool(lm.get("use_mup", True))
        residual = {**lm, "num_hidden_layers": d.get("residual_lm_num_layers", 8), "vocab_size": 0}
        residual["no_rope"] = bool(d.get("residual_lm_no_rope", False))
        dit = d["dit_config"]
        cfm = dict(dit.get("cfm_config") or {})
        cfg = cls(
            lm=_stack(lm, "lm_config"),
            residual=_stack(residual, "residual LM"),
            encoder=_stack(_local(lm, d["encoder_config"]), "encoder_config"),
            dit=_stack(_local(lm, dit), "dit_config"),
            cfm=CfmConfig(
                sigma_min=float(cfm.get("sigma_min", 1e-6)),
                solver=str(cfm.get("solver", "euler")),
                # the reference reads ``dit_mean_mode`` (the published file writes ``mean_mode``: both false)
                mean_mode=bool(dit.get("dit_mean_mode", dit.get("mean_mode", False))),
            ),
            vae=AudioVAEConfig.from_dict(d.get("audio_vae_config")),
            patch_size=int(d.get("patch_size", 4)),
            feat_dim=int(d.get("feat_dim", 64)),
            fsq_latent_dim=int(d.get("scalar_quantization_latent_dim", 512)),
            fsq_scale=int(d.get("scalar_quantization_scale", 9)),
            scale_emb=float(lm.get("scale_emb", 1.0)) if use_mup else 1.0,
            max_length=int(d.get("max_length", 8192)),
        )
        if cfg.cfm.solver != "euler":
            raise ConfigError(f"dit_config.cfm_config.solver={cfg.cfm.solver!r} is not supported (euler)")
        if cfg.vae.latent_dim != cfg.feat_dim:
            raise ConfigError(f"feat_dim={cfg.feat_dim} differs from audio_vae_config.latent_dim")
        if cfg.lm.decoder.vocab_size <= REF_AUDIO_END_ID:
            raise ConfigError(f"lm_config.vocab_size must exceed the special id {REF_AUDIO_END_ID}")
        kv = (cfg.lm.decoder.num_key_value_heads, cfg.lm.decoder.head_dim)
        if (cfg.residual.decoder.num_key_value_heads, cfg.residual.decoder.head_dim) != kv:
            raise ConfigError("the residual LM must share the base LM's KV heads and head size")
        return cfg


def _local(lm: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    """A local encoder / DiT stack: ``lm_config`` with the section's width, FFN, heads, depth, head size."""
    try:
        return {
            **lm,
            "hidden_size": local["hidden_dim"],
            "intermediate_size": local["ffn_dim"],
            "num_attention_heads": local["num_heads"],
            "num_hidden_layers": local.get("num_layers", 4),
            "kv_channels": local.get("kv_channels"),
            "vocab_size": 0,
            "no_rope": False,
        }
    except KeyError as e:
        raise ConfigError(f"encoder_config / dit_config is missing {e}") from e


def _stack(d: dict[str, Any], where: str) -> Stack:
    need = ["hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size"]
    missing = [k for k in need + ["rms_norm_eps", "rope_theta"] if k not in d]
    if missing:
        raise ConfigError(f"{where} is missing {missing}")
    heads, layers = int(d["num_attention_heads"]), int(d["num_hidden_layers"])
    head_dim = int(d.get("kv_channels") or int(d["hidden_size"]) // heads)
    use_mup = bool(d.get("use_mup", True))
    scale = float(d.get("scale_depth", 1.0)) / math.sqrt(layers) if use_mup and layers else 1.0
    no_rope = bool(d.get("no_rope", False))
    max_pos = int(d.get("max_position_embeddings", 32768))
    dec = DecoderConfig(
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(d.get("num_key_value_heads", heads)),
        intermediate_size=int(d["intermediate_size"]),
        head_dim=head_dim,
        rms_norm_eps=float(d["rms_norm_eps"]),
        rope_theta=float(d["rope_theta"]),
        max_position_embeddings=max_pos,
        qk_norm=False,
        residual_scale=scale,
        use_rope=not no_rope,
    )
    rope = None
    if not no_rope:
        if not isinstance(d.get("rope_scaling"), dict):
            raise ConfigError(f"{where}: lm_config.rope_scaling (LongRoPE) is required")
        rope = LongRope.from_dict(d["rope_scaling"], max_pos, head_dim)
    return Stack(dec, rope)
