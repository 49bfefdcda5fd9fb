"""Configs of a Qwen3-TTS checkpoint: ``config.json`` (``Qwen3TTSForConditionalGeneration``) and
``speech_tokenizer/config.json`` (``Qwen3TTSTokenizerV2Model``, the 12 Hz codec).

Key names and defaults follow the published Qwen/Qwen3-TTS-12Hz-* configs and ``qwen-tts`` 0.1.1
(``configuration_qwen3_tts.py``, ``configuration_qwen3_tts_tokenizer_v2.py``). Where the reference has no
default (``text_vocab_size``, ``spk_id``, ``codec_language_id``, ``spk_is_dialect``, the decoder's
``codebook_dim``) a missing key is a :class:`ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omniduplex.models.config import ConfigError, DecoderConfig
from omniduplex.models.qwen3_omni.code2wav_config import Code2WavConfig

ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
CODEC_ARCHITECTURE = "Qwen3TTSTokenizerV2Model"
VARIANTS = ("base", "custom_voice", "voice_design")
"""``tts_model_type``: Base clones a voice from reference audio (x-vector, optionally in-context codes);
CustomVoice has named speakers; VoiceDesign takes a described voice (instruction)."""


def _decoder(d: dict[str, Any], what: str) -> DecoderConfig:
    """A talker / code-predictor decoder; the reference's defaults where the dict is silent."""
    d = dict(d)
    d.setdefault("rope_theta", 10000.0)  # both reference configs default to 10000
    rope = d.get("rope_scaling") or {}
    if what == "talker" and rope and not rope.get("interleaved", False):
        # non-interleaved M-RoPE also reduces to 1-D RoPE for text-only positions, but the published
        # checkpoints are interleaved; refuse what we have not checked against the reference
        raise ConfigError("talker_config.rope_scaling.interleaved=false is not supported")
    try:
        return DecoderConfig.from_dict(d)
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from e


@dataclass
class SpeakerEncoderConfig:
    """``speaker_encoder_config``: ECAPA-TDNN over a 128-bin log-mel of 24 kHz audio."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: list[int] = field(default_factory=lambda: [512, 512, 512, 512, 1536])
    enc_kernel_sizes: list[int] = field(default_factory=lambda: [5, 3, 3, 3, 1])
    enc_dilations: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 1])
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    def __post_init__(self) -> None:
        n = len(self.enc_channels)
        if n < 3 or len(self.enc_kernel_sizes) != n or len(self.enc_dilations) != n:
            raise ConfigError(
                "speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations need the same "
                f"length >= 3, got {n}, {len(self.enc_kernel_sizes)}, {len(self.enc_dilations)}"
            )
        for c in self.enc_channels[1:-1]:
            if c % self.enc_res2net_scale:
                raise ConfigError(f"speaker_encoder_config: channels {c} not divisible by res2net scale")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})


@dataclass
class TTSConfig:
    """The parts of ``config.json`` our modules and prompt builder need."""

    variant: str
    talker: DecoderConfig
    predictor: DecoderConfig
    num_code_groups: int
    text_vocab_size: int
    text_hidden_size: int
    codec_ids: dict[str, int]
    """``eos``, ``think``, ``nothink``, ``think_bos``, ``think_eos``, ``pad``, ``bos`` codec ids."""
    speakers: dict[str, int]
    speaker_dialect: dict[str, str | bool]
    languages: dict[str, int]
    text_ids: dict[str, int]
    """``tts_bos``, ``tts_eos``, ``tts_pad``, ``im_start``, ``im_end`` text-token ids."""
    speaker_encoder: SpeakerEncoderConfig | None

    @property
    def text(self) -> DecoderConfig:
        """The talker decoder (the name the engine's ``TalkerAdapter`` reads, as for Qwen3-Omni)."""
        return self.talker

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TTSConfig:
        """Parse ``config.json``.

        Raises:
            ConfigError: unknown ``tts_model_type``, a key without reference default missing, or a
                decoder config our layers do not support.
        """
        variant = raw.get("tts_model_type")
        if variant not in VARIANTS:
            raise ConfigError(f"tts_model_type={variant!r}; expected one of {VARIANTS}")
        t = dict(raw.get("talker_config") or {})
        missing = [
            k for k in ("text_vocab_size", "spk_id", "codec_language_id", "spk_is_dialect") if k not in t
        ]
        if missing:
            raise ConfigError(f"talker_config is missing {missing} (no default in the reference)")
        t.setdefault("vocab_size", 3072)
        talker = _decoder(t, "talker")
        p = dict(t.get("code_predictor_config") or {})
        p.setdefault("head_dim", 128)  # Qwen3TTSTalkerCodePredictorConfig default
        p.setdefault("vocab_size", 2048)
        predictor = _decoder(p, "code_predictor")
        groups = int(t.get("num_code_groups", 32))
        if groups < 2:
            raise ConfigError(f"num_code_groups={groups} must be >= 2")
        codec_ids = {
            "eos": t.get("codec_eos_token_id", 4198),
            "think": t.get("codec_think_id", 4202),
            "nothink": t.get("codec_nothink_id", 4203),
            "think_bos": t.get("codec_think_bos_id", 4204),
            "think_eos": t.get("codec_think_eos_id", 4205),
            "pad": t.get("codec_pad_id", 4196),
            "bos": t.get("codec_bos_id", 4197),
        }
        bad = {k: v for k, v in codec_ids.items() if not 0 <= v < talker.vocab_size}
        if bad:
            raise ConfigError(f"codec ids {bad} outside the talker vocabulary [0, {talker.vocab_size})")
        se = raw.get("speaker_encoder_config")
        return cls(
            variant=variant,
            talker=talker,
            predictor=predictor,
            num_code_groups=groups,
            text_vocab_size=int(t["text_vocab_size"]),
            text_hidden_size=int(t.get("text_hidden_size", 2048)),
            codec_ids=codec_ids,
            speakers={k.lower(): int(v) for k, v in (t["spk_id"] or {}).items()},
            speaker_dialect={k.lower(): v for k, v in (t["spk_is_dialect"] or {}).items()},
            languages={k.lower(): int(v) for k, v in (t["codec_language_id"] or {}).items()},
            text_ids={
                "tts_bos": raw.get("tts_bos_token_id", 151672),
                "tts_eos": raw.get("tts_eos_token_id", 151673),
                "tts_pad": raw.get("tts_pad_token_id", 151671),
                "im_start": raw.get("im_start_token_id", 151644),
                "im_end": raw.get("im_end_token_id", 151645),
            },
            speaker_encoder=SpeakerEncoderConfig.from_dict(se or {}) if variant == "base" else None,
        )


@dataclass
class CodecDecoderConfig(Code2WavConfig):
    """``decoder_config`` of the 12 Hz speech tokenizer (defaults: ``Qwen3TTSTokenizerV2DecoderConfig``):
    Qwen3-Omni's Code2Wav settings (its frame transformer and conv stack, :class:`Code2WavConfig`), plus the
    split RVQ's ``codebook_dim`` (required) and the ``latent_dim`` the conv stack runs on.

    ``head_dim``: the attention head width; ``0`` (no key) means ``hidden_size // num_attention_heads``, as
    the reference's ``getattr(config, "head_dim", hidden_size // num_attention_heads)`` (qwen-tts 0.1.1,
    ``Qwen3TTSTokenizerV2DecoderAttention``; its RoPE reads the same key).
    """

    codebook_dim: int = 0
    latent_dim: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.codebook_dim < 2 or self.codebook_dim % 2:
            raise ConfigError(f"codec decoder: codebook_dim={self.codebook_dim} must be even and >= 2")
        if self.num_quantizers < 2:
            raise ConfigError(f"codec decoder: num_quantizers={self.num_quantizers} must be >= 2")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodecDecoderConfig:
        """Raises ConfigError when ``codebook_dim`` (no reference default) is missing, or as
        :meth:`Code2WavConfig.from_dict` does."""
        if "codebook_dim" not in d:
            raise ConfigError("speech tokenizer decoder_config is missing 'codebook_dim'")
        return super().from_dict(d)  # head_dim honoured (0 or absent: hidden_size // heads)
