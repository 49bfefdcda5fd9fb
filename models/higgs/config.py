"""Configs of a Higgs Audio v3 checkpoint: ``config.json`` (``HiggsMultimodalQwen3ForConditionalGeneration``)
and ``audio_tokenizer/config.json`` (the Higgs audio tokenizer, ``transformers``'
``higgs_audio_v2_tokenizer``).

The talker config follows the published ``bosonai/higgs-audio-v3-tts-4b`` ``config.json`` (model type
``higgs_multimodal_qwen3``): a Qwen3 ``text_config``; ``audio_encoder_config`` with ``encoder_type``
(``discrete``), ``num_codebooks`` (8), ``vocab_size`` (1026 per codebook: codes ``0..1023`` plus BOC
``1024`` and EOC ``1025``), ``out_dim`` (the backbone width), ``tie_word_embeddings`` (the audio head
shares the fused audio embedding) and ``use_delay_pattern``; ``audio_token_id`` (``-100``, the prompt
placeholder of a reference-audio row); ``sample_rate`` (24000) and ``audio_tokenizer_id`` (the codec's repo,
``bosonai/higgs-audio-v2-tokenizer``). ``transformers``' ``HiggsAudioV2Config`` (the v2 reference) names the
same quantities ``num_codebooks``, ``codebook_size``, ``audio_stream_bos_id``/``audio_stream_eos_id``.

The codec config is ``transformers``' ``HiggsAudioV2TokenizerConfig`` dict: an ``acoustic_model_config``
(DAC) and a ``semantic_model_config`` (HuBERT) whose widths add up to the quantizer width, ``codebook_size``,
``codebook_dim``, ``target_bandwidths`` (the last one fixes the number of quantizers), ``sample_rate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omniduplex.models.config import ConfigError, DecoderConfig

ARCHITECTURE = "HiggsMultimodalQwen3ForConditionalGeneration"
MODEL_TYPE = "higgs_multimodal_qwen3"
CODEC_MODEL_TYPE = "higgs_audio_v2_tokenizer"
CODEC_DIR = "audio_tokenizer"
"""Subfolder holding the codec checkpoint (``config.audio_tokenizer_id``'s repo, ``transformers`` layout)."""

ACOUSTIC_DEFAULTS: dict[str, Any] = {
    "encoder_hidden_size": 64,
    "downsampling_ratios": [8, 5, 4, 2],
    "decoder_hidden_size": 1024,
    "upsampling_ratios": [8, 5, 4, 2],
    "hidden_size": 256,
}
"""``HiggsAudioV2TokenizerConfig._default_acoustic_model_config_kwargs`` (``transformers`` 5.19): merged under
the checkpoint's ``acoustic_model_config``, so these win over ``DacConfig``'s own derivations."""
SEMANTIC_HIDDEN_DEFAULT = 768
"""``HubertConfig.hidden_size`` default (the semantic model when ``semantic_model_config`` is silent)."""


@dataclass
class HiggsConfig:
    """``config.json`` of a Higgs Audio v3 checkpoint (see the module docstring for the keys).

    ``boc_id``/``eoc_id`` are the last two ids of each codebook's ``vocab_size`` (1024/1025 for the published
    1026), ``codebook_size`` the codes proper (``vocab_size − 2``, the codec's codebook).
    """

    text: DecoderConfig
    num_codebooks: int = 8
    vocab_size: int = 1026
    tie_audio_embeddings: bool = True
    audio_token_id: int = -100
    sample_rate: int = 24000
    audio_tokenizer_id: str = "bosonai/higgs-audio-v2-tokenizer"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_codebooks < 2:
            raise ConfigError(f"audio_encoder_config.num_codebooks={self.num_codebooks} must be >= 2")
        if self.vocab_size < 3:
            raise ConfigError(
                f"audio_encoder_config.vocab_size={self.vocab_size} leaves no codes beside BOC/EOC"
            )

    @property
    def boc_id(self) -> int:
        """Begin-of-codebook id (``audio_encoder_config.vocab_size − 2``; ``audio_stream_bos_id`` in v2)."""
        return self.vocab_size - 2

    @property
    def eoc_id(self) -> int:
        """End-of-codebook id (``audio_encoder_config.vocab_size − 1``; ``audio_stream_eos_id`` in v2)."""
        return self.vocab_size - 1

    @property
    def codebook_size(self) -> int:
        """Codes a frame may carry to the codec (``0 .. codebook_size − 1``)."""
        return self.vocab_size - 2

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HiggsConfig:
        """Read the published keys.

        Raises:
            ConfigError: no ``text_config``, an ``audio_encoder_config`` other than a discrete,
                delay-pattern codec as wide as the backbone, or an invalid decoder config.
        """
        if "text_config" not in d:
            raise ConfigError("config.json has no text_config")
        text = dict(d["text_config"])
        text.setdefault("rope_theta", 1_000_000.0)  # published sub-config ships rope_theta=null: Qwen3's 1e6
        dec = DecoderConfig.from_dict(text)
        enc = dict(d.get("audio_encoder_config") or {})
        if enc.get("encoder_type", "discrete") != "discrete":
            raise ConfigError(
                f"audio_encoder_config.encoder_type={enc['encoder_type']!r}: only 'discrete' TTS"
            )
        if not enc.get("use_delay_pattern", True):
            raise ConfigError("audio_encoder_config.use_delay_pattern=false is not supported")
        out_dim = int(enc.get("out_dim", dec.hidden_size))
        if out_dim != dec.hidden_size:
            raise ConfigError(
                f"audio_encoder_config.out_dim={out_dim} != text_config.hidden_size={dec.hidden_size}"
            )
        return cls(
            text=dec,
            num_codebooks=int(enc.get("num_codebooks", 8)),
            vocab_size=int(enc.get("vocab_size", 1026)),
            tie_audio_embeddings=bool(enc.get("tie_word_embeddings", True)),
            audio_token_id=int(d.get("audio_token_id", -100)),
            sample_rate=int(d.get("sample_rate", 24000)),
            audio_tokenizer_id=str(d.get("audio_tokenizer_id", "bosonai/higgs-audio-v2-tokenizer")),
        )


@dataclass
class HiggsCodecConfig:
    """The decode side of a ``HiggsAudioV2TokenizerConfig`` dict.

    ``hidden_size`` (quantizer width) = acoustic ``hidden_size`` + semantic ``hidden_size``;
    ``num_quantizers = ⌊1000 · target_bandwidths[-1] / (frame_rate · ⌈log2 codebook_size⌉)⌋`` with
    ``frame_rate = ⌈sample_rate / hop_length⌉`` and ``hop_length`` the product of the acoustic
    ``downsampling_ratios`` (as ``HiggsAudioV2TokenizerConfig`` derives them).
    """

    acoustic_hidden_size: int
    decoder_hidden_size: int
    upsampling_ratios: list[int]
    hop_length: int
    semantic_hidden_size: int
    codebook_size: int = 1024
    codebook_dim: int = 64
    num_quantizers: int = 8
    sample_rate: int = 24000

    @property
    def hidden_size(self) -> int:
        return self.acoustic_hidden_size + self.semantic_hidden_size

    @property
    def frame_rate(self) -> int:
        return math.ceil(self.sample_rate / self.hop_length)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HiggsCodecConfig:
        """Raises ConfigError: ratios whose product differs between encoder and decoder, a decoder width
        that does not halve once per upsampling block, or no quantizer for the top bandwidth."""
        ac = {**ACOUSTIC_DEFAULTS, **dict(d.get("acoustic_model_config") or {})}
        sem = dict(d.get("semantic_model_config") or {})
        down, up = [int(s) for s in ac["downsampling_ratios"]], [int(s) for s in ac["upsampling_ratios"]]
        hop = math.prod(down)
        if math.prod(up) != hop:
            raise ConfigError(
                f"acoustic_model_config: upsampling_ratios {up} and downsampling_ratios {down} "
                "differ in product"
            )
        dec_ch = int(ac["decoder_hidden_size"])
        if dec_ch % 2 ** len(up):
            raise ConfigError(f"decoder_hidden_size={dec_ch} is not divisible by 2^{len(up)}")
        codebook_size = int(d.get("codebook_size", 1024))
        sr = int(d.get("sample_rate", 24000))
        bws = d.get("target_bandwidths") or [0.5, 1, 1.5, 2, 4]
        nq = int(1000 * float(bws[-1]) // (math.ceil(sr / hop) * math.ceil(math.log2(codebook_size))))
        if nq < 1:
            raise ConfigError(f"target_bandwidths {bws} give no quantizer at {sr} Hz / hop {hop}")
        return cls(
            acoustic_hidden_size=int(ac["hidden_size"]),
            decoder_hidden_size=dec_ch,
            upsampling_ratios=up,
            hop_length=hop,
            semantic_hidden_size=int(sem.get("hidden_size", SEMANTIC_HIDDEN_DEFAULT)),
            codebook_size=codebook_size,
            codebook_dim=int(d.get("codebook_dim", 64)),
            num_quantizers=nq,
            sample_rate=sr,
        )
