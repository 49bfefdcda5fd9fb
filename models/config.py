"""Typed views of Hugging Face ``config.json`` dicts for the decoder-style models.

Only the fields our implementations read are kept; unknown keys are ignored so published configs
(Qwen3-Omni, Qwen3, Qwen3-MoE) load unchanged. Defaults follow ``transformers``'
``Qwen3OmniMoe*Config`` classes (model card: Qwen/Qwen3-Omni-30B-A3B-Instruct).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config.json that is missing a required key or contradicts itself."""


DECODER_ALIASES: dict[str, str] = {"num_local_experts": "num_experts"}
"""``config.json`` key → :class:`DecoderConfig` field, from the ``attribute_map`` of the ``transformers``
config classes whose dicts it reads (``Qwen3MoeConfig``, ``Qwen3OmniMoeTalkerTextConfig``: ``num_experts``
is an alias of ``num_local_experts``, the key a checkpoint re-saved by ``transformers`` 5.x writes)."""


def resolve_aliases(d: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """A copy of ``d`` with each alias key of ``aliases`` (key → field name) also under its field name; a
    key already present under the field name wins. ``transformers`` accepts both spellings of an
    ``attribute_map`` pair and writes the attribute's own name, so a loader must read either."""
    out = dict(d)
    for alias, name in aliases.items():
        if alias in d and out.get(name) is None:
            out[name] = d[alias]
    return out


def _pick(cls, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names and v is not None}


@dataclass
class DecoderConfig:
    """A Qwen3-family or Llama decoder: RMSNorm, GQA attention, RoPE, SwiGLU MLP or MoE.

    Covers the Thinker text model, the Talker text model (MoE + shared expert), the code
    predictor (dense) and Llama text LMs. ``num_experts == 0`` means every layer is dense.
    ``qk_norm``: per-head RMSNorm on q and k before RoPE (Qwen3: True; Llama has none: False). It is
    not a ``config.json`` key; the registry sets it from the architecture.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int = 0
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    qkv_bias: bool | None = None
    """q/k/v projection biases; ``None``: as ``attention_bias`` (Llama's flag covers o_proj too). Qwen2 has
    q/k/v biases and none on o_proj; the registry sets it from the architecture."""
    hidden_act: str = "silu"
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    shared_expert_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    qk_norm: bool = True
    residual_scale: float = 1.0
    """Multiplier of each sublayer's output before its residual add (MiniCPM's depth-scaled residuals with
    ``use_mup``: ``scale_depth / sqrt(num_hidden_layers)``); not a ``config.json`` key."""
    use_rope: bool = True
    """``False``: no positional encoding (NoPE; VoxCPM2's residual LM, ``residual_lm_no_rope``)."""

    def __post_init__(self) -> None:
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.hidden_act != "silu":
            raise ConfigError(f"hidden_act={self.hidden_act!r} is not supported (only 'silu')")
        if self.num_experts and self.num_experts_per_tok > self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}"
            )

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Whether decoder layer ``layer_idx`` uses the sparse MoE block (Qwen3-MoE rule)."""
        return (
            self.num_experts > 0
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any], **overrides: Any) -> DecoderConfig:
        """Build from a HF text-config dict (``rope_theta`` may sit in ``rope_parameters``; the aliases of
        :data:`DECODER_ALIASES` are read too).

        Raises:
            ConfigError: a required key is missing, a RoPE scaling type other than ``default`` (plain
                RoPE; Qwen3-Omni's M-RoPE reduces to it for text and audio) is asked for, or
                ``mlp_bias`` is set (our SwiGLU MLP has no biases).
        """
        d = resolve_aliases(d, DECODER_ALIASES)
        for key in ("rope_parameters", "rope_scaling"):
            sub = d.get(key) or {}
            if "rope_theta" in sub and "rope_theta" not in d:
                d["rope_theta"] = sub["rope_theta"]
            kind = sub.get("rope_type", sub.get("type", "default"))
            if kind != "default":
                raise ConfigError(f"{key}.rope_type={kind!r} is not supported (only 'default' RoPE)")
        if d.get("mlp_bias"):
            raise ConfigError("mlp_bias=true is not supported (the MLP projections have no bias)")
        d.update(overrides)
        missing = [
            k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if k not in d
        ]
        if missing:
            raise ConfigError(f"text config is missing {missing}")
        d.setdefault("num_key_value_heads", d["num_attention_heads"])
        return cls(**_pick(cls, d))


@dataclass
class ThinkerConfig:
    """``thinker_config`` of a Qwen3-Omni checkpoint (text decoder + audio tower + special token ids)."""

    text: DecoderConfig
    audio: dict[str, Any]
    audio_token_id: int = 151646
    audio_start_token_id: int = 151647
    audio_end_token_id: int = 151648
    user_token_id: int = 872

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ThinkerConfig:
        if "text_config" not in d:
            raise ConfigError("thinker_config has no text_config")
        kw = {
            k: d[k]
            for k in ("audio_token_id", "audio_start_token_id", "audio_end_token_id", "user_token_id")
            if k in d
        }
        text = dict(d["text_config"])
        text.setdefault("tie_word_embeddings", d.get("tie_word_embeddings", False))
        return cls(text=DecoderConfig.from_dict(text), audio=dict(d.get("audio_config") or {}), **kw)


@dataclass
class TalkerConfig:
    """``talker_config``: the codec LM over codebook 0, its code predictor, and codec special ids."""

    text: DecoderConfig
    code_predictor: DecoderConfig
    num_code_groups: int
    thinker_hidden_size: int
    accept_hidden_layer: int
    codec_eos_token_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_pad_id: int
    codec_bos_id: int
    speaker_id: dict[str, int]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TalkerConfig:
        for key in ("text_config", "code_predictor_config"):
            if key not in d:
                raise ConfigError(f"talker_config has no {key}")
        text = resolve_aliases(d["text_config"], DECODER_ALIASES)
        if text.get("num_experts", 0) and "shared_expert_intermediate_size" not in text:
            raise ConfigError("talker_config.text_config.shared_expert_intermediate_size is required")
        defaults = dict(
            num_code_groups=32,
            thinker_hidden_size=2048,
            accept_hidden_layer=18,
            codec_eos_token_id=4198,
            codec_nothink_id=4203,
            codec_think_bos_id=4204,
            codec_think_eos_id=4205,
            codec_pad_id=4196,
            codec_bos_id=4197,
        )
        kw = {k: d.get(k, v) for k, v in defaults.items()}
        cfg = cls(
            text=DecoderConfig.from_dict(text),
            code_predictor=DecoderConfig.from_dict(d["code_predictor_config"]),
            speaker_id=dict(d.get("speaker_id") or {}),
            **kw,
        )
        if cfg.num_code_groups < 2:
            raise ConfigError(f"talker_config.num_code_groups={cfg.num_code_groups} must be >= 2")
        return cfg


@dataclass
class OmniConfig:
    """Top-level ``Qwen3OmniMoeForConditionalGeneration`` config: the sub-configs and chat token ids."""

    thinker: ThinkerConfig
    talker: TalkerConfig | None
    code2wav: dict[str, Any] | None
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    system_token_id: int = 8948
    user_token_id: int = 872
    assistant_token_id: int = 77091

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OmniConfig:
        if "thinker_config" not in d:
            raise ConfigError("config.json has no thinker_config")
        audio_out = d.get("enable_audio_output", True) and "talker_config" in d
        names = [f.name for f in dataclasses.fields(cls)][3:]
        return cls(
            thinker=ThinkerConfig.from_dict(d["thinker_config"]),
            talker=TalkerConfig.from_dict(d["talker_config"]) if audio_out else None,
            code2wav=dict(d["code2wav_config"]) if audio_out and "code2wav_config" in d else None,
            **{k: d[k] for k in names if k in d},
        )
