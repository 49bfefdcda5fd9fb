"""``code2wav_config`` of a Qwen3-Omni checkpoint: the settings of :mod:`.code2wav` (and, extended, of the
Qwen3-TTS 12 Hz codec decoder, :class:`omniduplex.models.qwen3_tts.config.CodecDecoderConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from omniduplex.models.config import ConfigError


@dataclass
class Code2WavConfig:
    """``code2wav_config`` of a Qwen3-Omni checkpoint; defaults follow ``Qwen3OmniMoeCode2WavConfig``.

    ``head_dim == 0`` means ``hidden_size // num_attention_heads`` (the published config has no head_dim).
    """

    codebook_size: int = 2048
    hidden_size: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 0
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    def __post_init__(self) -> None:
        self.upsample_rates = tuple(int(r) for r in self.upsample_rates)
        self.upsampling_ratios = tuple(int(r) for r in self.upsampling_ratios)
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"code2wav: num_attention_heads={self.num_attention_heads} is not a multiple "
                f"of num_key_value_heads={self.num_key_value_heads}"
            )
        if self.hidden_act != "silu":
            raise ConfigError(f"code2wav: hidden_act={self.hidden_act!r} is not supported (only 'silu')")
        if self.sliding_window < 1:
            raise ConfigError(f"code2wav: sliding_window={self.sliding_window} must be >= 1")
        if any(r < 1 for r in self.upsample_rates + self.upsampling_ratios):
            raise ConfigError(
                f"code2wav: upsample rates {self.upsample_rates}/{self.upsampling_ratios} must be >= 1"
            )
        if self.decoder_dim >> len(self.upsample_rates) < 1:
            raise ConfigError(
                f"code2wav: decoder_dim={self.decoder_dim} is too small to halve "
                f"{len(self.upsample_rates)} times"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Code2WavConfig:
        """Build from a HF ``code2wav_config`` dict; unknown keys are ignored, missing keys take HF defaults.

        ``rope_theta`` may sit at top level (older configs) or in ``rope_parameters``/``rope_scaling``.

        Raises:
            ConfigError: a RoPE type other than ``default``, or a config that contradicts itself.
        """
        d = dict(d)
        for key in ("rope_parameters", "rope_scaling"):
            sub = d.get(key) or {}
            if sub.get("rope_type", sub.get("type", "default")) != "default":
                raise ConfigError(f"code2wav: {key}.rope_type={sub.get('rope_type')!r} is not supported")
            if "rope_theta" in sub and "rope_theta" not in d:
                d["rope_theta"] = sub["rope_theta"]
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})
