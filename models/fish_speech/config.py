"""Typed view of a Fish Speech S2 Pro ``config.json`` (``model_type`` ``fish_qwen3_omni``) and its codec
config.

Published layout (fishaudio/s2-pro ``config.json``): ``text_config`` (``fish_qwen3``: the slow AR, a Qwen3
decoder: ``dim``, ``n_layer``, ``n_head``, ``n_local_heads``, ``head_dim``, ``intermediate_size``,
``rope_base``, ``norm_eps``, ``max_seq_len``, ``vocab_size``, ``tie_word_embeddings``, ``attention_qkv_bias``,
``attention_o_bias``, ``attention_qk_norm``), ``audio_decoder_config`` (``fish_qwen3_audio_decoder``: the fast
AR, the same keys plus ``num_codebooks`` and ``vocab_size`` = the codebook size) and the top-level ids
``semantic_start_token_id`` / ``semantic_end_token_id`` (the slow AR's semantic tokens, one per code of
codebook 0), ``eos_token_id`` (``<|im_end|>``), ``pad_token_id``, ``audio_pad_token_id``.

Defaults and derived values follow ``fish_speech/models/text2semantic/llama.py`` (``BaseModelArgs``,
``DualARModelArgs``, ``_from_fish_qwen3_omni``): ``n_local_heads`` defaults to ``n_head``, ``head_dim`` to 64,
``intermediate_size`` to ``find_multiple(int(2 · 4 · dim / 3), 256)``; a fast-AR key that is absent takes the
slow AR's value; the fast AR uses the slow AR's ``rope_base`` and ``norm_eps`` (the published code builds it
from the slow config with only width, heads, MLP and attention flags replaced, so ``audio_decoder_config``'s
own ``rope_base`` / ``norm_eps`` are not read); ``scale_codebook_embeddings`` and ``norm_fastlayer_input`` are
on for every ``fish_qwen3_omni`` checkpoint.

The codec (``codec/config.json``) is a ``transformers`` ``DacConfig`` dict with ``num_codebooks`` codebooks of
``vocab_size`` codes at 44.1 kHz: our DAC decoder and encoder (:mod:`omniduplex.models.codecs`) in
``DacModel``'s tensor layout (the published ``codec.pth`` is Fish Audio's own DAC variant, which this
project does not load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omniduplex.models.config import ConfigError, DecoderConfig

MODEL_TYPE = "fish_qwen3_omni"
CODEC_DIR = "codec"
SAMPLE_RATE = 44100
"""The codec's rate (Hz) of every Fish Speech S2 checkpoint (reference clips must come at it)."""


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def _decoder(d: dict[str, Any], vocab: int, base: dict[str, Any] | None, where: str) -> DecoderConfig:
    """A :class:`DecoderConfig` from a Fish sub-config; ``base`` (the slow AR's resolved keys) fills absent
    fast-AR keys and fixes ``rope_base`` / ``norm_eps`` (module docstring)."""
    base = base or {}
    get = {k: d.get(k, base.get(k)) for k in d.keys() | base.keys()}
    for key in ("dim", "n_layer", "n_head"):
        if get.get(key) is None:
            raise ConfigError(f"{where} is missing {key!r}")
    dim, heads = int(get["dim"]), int(get["n_head"])
    kv = get.get("n_local_heads")
    inter = get.get("intermediate_size") or _find_multiple(int(2 * 4 * dim / 3), 256)
    rope, eps = (base["rope_base"], base["norm_eps"]) if base else (d.get("rope_base"), d.get("norm_eps"))
    try:
        return DecoderConfig(
            vocab_size=vocab,
            hidden_size=dim,
            num_hidden_layers=int(get["n_layer"]),
            num_attention_heads=heads,
            num_key_value_heads=heads if kv in (None, -1) else int(kv),
            intermediate_size=int(inter),
            head_dim=int(get.get("head_dim") or 64),
            rms_norm_eps=float(1e-5 if eps is None else eps),
            rope_theta=float(10000 if rope is None else rope),
            attention_bias=bool(get.get("attention_o_bias") or False),
            qkv_bias=bool(get.get("attention_qkv_bias") or False),
            qk_norm=bool(get.get("attention_qk_norm") or False),
            tie_word_embeddings=bool(get.get("tie_word_embeddings", True)) if not base else False,
            max_position_embeddings=int(get.get("max_seq_len") or 2048),
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e


@dataclass
class FishConfig:
    """The fields of a ``fish_qwen3_omni`` config our modules read (module docstring for the keys).

    Attributes:
        slow: the slow AR (``text_config``); ``tie_word_embeddings`` says whether its output head is the
            token embedding.
        fast: the fast AR (``audio_decoder_config``; ``vocab_size`` = the codebook size).
        num_codebooks: codebooks per frame (codebook 0, the semantic one, included), ``N``.
        codebook_size: codes per codebook.
        semantic_begin_id, semantic_end_id: token ids of code 0 and code ``codebook_size − 1`` of codebook 0.
        im_end_id: ``<|im_end|>``, the slow AR's stop token (``eos_token_id``).
        max_seq_len: the slow AR's context (``text_config.max_seq_len``), prompt and frames together.
    """

    slow: DecoderConfig
    fast: DecoderConfig
    num_codebooks: int
    codebook_size: int
    semantic_begin_id: int
    semantic_end_id: int
    im_end_id: int
    pad_token_id: int
    audio_pad_token_id: int
    max_seq_len: int

    @property
    def text(self) -> DecoderConfig:
        """The slow AR's config under the name the engine's talker adapter reads."""
        return self.slow

    @property
    def num_code_groups(self) -> int:
        """``num_codebooks`` under the name the engine's talker adapter reads."""
        return self.num_codebooks

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FishConfig:
        """Raises ``ConfigError``: another ``model_type``, a missing key, or ids contradicting the sizes."""
        if d.get("model_type") != MODEL_TYPE:
            raise ConfigError(f"model_type {d.get('model_type')!r} is not {MODEL_TYPE!r}")
        for key in (
            "text_config",
            "audio_decoder_config",
            "semantic_start_token_id",
            "semantic_end_token_id",
        ):
            if key not in d:
                raise ConfigError(f"config.json is missing {key!r}")
        tc, adc = d["text_config"], d["audio_decoder_config"]
        for key, sub, where in (
            ("vocab_size", tc, "text_config"),
            ("vocab_size", adc, "audio_decoder_config"),
        ):
            if key not in sub:
                raise ConfigError(f"{where} is missing {key!r}")
        if "num_codebooks" not in adc:
            raise ConfigError("audio_decoder_config is missing 'num_codebooks'")
        slow = _decoder(tc, int(tc["vocab_size"]), None, "text_config")
        resolved = {
            "dim": slow.hidden_size,
            "n_layer": None,
            "n_head": slow.num_attention_heads,
            "n_local_heads": slow.num_key_value_heads,
            "head_dim": slow.head_dim,
            "intermediate_size": slow.intermediate_size,
            "attention_qkv_bias": slow.qkv_bias,
            "attention_o_bias": slow.attention_bias,
            "attention_qk_norm": slow.qk_norm,
            "rope_base": slow.rope_theta,
            "norm_eps": slow.rms_norm_eps,
        }
        cfg = cls(
            slow=slow,
            fast=_decoder(adc, int(adc["vocab_size"]), resolved, "audio_decoder_config"),
            num_codebooks=int(adc["num_codebooks"]),
            codebook_size=int(adc["vocab_size"]),
            semantic_begin_id=int(d["semantic_start_token_id"]),
            semantic_end_id=int(d["semantic_end_token_id"]),
            im_end_id=int(d.get("eos_token_id", 151645)),
            pad_token_id=int(d.get("pad_token_id", 151669)),
            audio_pad_token_id=int(d.get("audio_pad_token_id", 151677)),
            max_seq_len=slow.max_position_embeddings,
        )
        cfg._check()
        return cfg

    def _check(self) -> None:
        n = self.semantic_end_id - self.semantic_begin_id + 1
        if n != self.codebook_size:
            raise ConfigError(
                f"semantic tokens {self.semantic_begin_id}..{self.semantic_end_id} are {n} ids for a "
                f"codebook of {self.codebook_size}"
            )
        v = self.slow.vocab_size
        for name, i in (("semantic_end_token_id", self.semantic_end_id), ("eos_token_id", self.im_end_id)):
            if not 0 <= i < v:
                raise ConfigError(f"{name}={i} outside the text vocabulary [0, {v})")
        if self.semantic_begin_id <= self.im_end_id <= self.semantic_end_id:
            raise ConfigError(f"eos_token_id={self.im_end_id} lies among the semantic tokens")
        if self.num_codebooks < 2:
            raise ConfigError(f"num_codebooks={self.num_codebooks} must be >= 2")


def check_codec(cfg: FishConfig, codec: dict[str, Any]) -> None:
    """Raises ``ConfigError`` unless the codec config has the model's codebooks at 44.1 kHz."""
    want = {
        "n_codebooks": cfg.num_codebooks,
        "codebook_size": cfg.codebook_size,
        "sampling_rate": SAMPLE_RATE,
    }
    for key, value in want.items():
        if codec.get(key) != value:
            raise ConfigError(f"{CODEC_DIR}/config.json {key}={codec.get(key)!r}, the model needs {value}")
