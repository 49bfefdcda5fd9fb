"""Deterministic random-weight ``OmniduplexUnifiedLM`` checkpoints (``init-model --arch unified``).

``tiny`` (S = 4 streams, codebook 64, hidden 64, 2 layers, GQA 4:2) for tests; ``small`` (S = 8,
codebook 1024, hidden 512, 12 layers, ~55M LM parameters) for CPU benchmarks. Every tensor is drawn
from a generator seeded by ``(seed, tensor name)`` (:func:`.presets.draw_tensor`), so the files are
byte-identical across runs. Codec tensors (``codec.*``, both halves of a ``transformers`` ``DacModel``:
the decoder and the encoder with ``in_proj``): Snake α = 1, biases 0, codebooks N(0, 1), convs
N(0, 0.36/fan_in): the waveform is O(0.1), neither silent nor clipped.

Text region: the presets' byte tokenizer (:mod:`.tokenizer`) plus :data:`UNIFIED_SPECIAL_TOKENS`,
padded to ``text_vocab_size``. Specials: bos ``<|im_start|>``, text eos ``<|im_end|>``, speech start
``<|speech_start|>``, bridge ``[<|speech_start|>, <|audio_start|>]`` (close the text, open the codec
segment), CFG null prompt ``<|cfg_null|>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniduplex.models.checkpoint import published_shapes_of
from omniduplex.models.codecs.dac import DacCodec, DacDecoderConfig
from omniduplex.models.codecs.dac_encoder import DacCodecEncoder, DacEncoderConfig
from omniduplex.models.qwen3_omni.presets import draw_tensor
from omniduplex.models.tokenizer import PRESET_SPECIAL_TOKENS, build_byte_tokenizer
from omniduplex.models.unified.model import UnifiedConfig, UnifiedLM

UNIFIED_SPECIAL_TOKENS = ["<|speech_start|>", "<|cfg_null|>"]
"""Appended after the byte tokenizer's own specials (ids 256 + 15 = 271, 272)."""
PRESETS = ("tiny", "small")


def unified_token_ids() -> dict[str, int]:
    """Special token name → id in the unified preset tokenizer."""
    names = PRESET_SPECIAL_TOKENS + UNIFIED_SPECIAL_TOKENS
    return {name: 256 + i for i, name in enumerate(names)}


def build_unified_tokenizer():
    """The byte tokenizer with :data:`UNIFIED_SPECIAL_TOKENS` added."""
    tok = build_byte_tokenizer()
    tok.add_special_tokens(UNIFIED_SPECIAL_TOKENS)
    return tok


def unified_config(preset: str) -> dict:
    """The ``config.json`` dict of a preset.

    Raises:
        ValueError: unknown preset.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESETS)}")
    tiny = preset == "tiny"
    ids = unified_token_ids()
    s, cb = (4, 64) if tiny else (8, 1024)
    text_vocab = 288 if tiny else 8192
    audio_vocab = cb + 2
    decoder = dict(
        vocab_size=text_vocab + s * audio_vocab,
        hidden_size=64 if tiny else 512,
        num_hidden_layers=2 if tiny else 12,
        num_attention_heads=4 if tiny else 8,
        num_key_value_heads=2 if tiny else 4,
        head_dim=16 if tiny else 64,
        intermediate_size=128 if tiny else 1536,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        attention_bias=False,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    )
    codec = dict(
        model_type="dac",
        encoder_hidden_size=4 if tiny else 16,
        downsampling_ratios=[2, 4, 8, 8],
        decoder_hidden_size=32 if tiny else 256,
        n_codebooks=s,
        codebook_size=cb,
        codebook_dim=8,
        sampling_rate=44100,
    )
    cfg = UnifiedConfig.from_dict(
        dict(
            decoder,
            text_vocab_size=text_vocab,
            num_streams=s,
            codebook_size=cb,
            audio_vocab_size=audio_vocab,
            bos_token_id=ids["<|im_start|>"],
            eos_token_id=ids["<|im_end|>"],
            speech_start_token_id=ids["<|speech_start|>"],
            bridge_token_ids=[ids["<|speech_start|>"], ids["<|audio_start|>"]],
            null_prompt_id=ids["<|cfg_null|>"],
            codec_config=codec,
        )
    )
    return cfg.to_dict()


def draw_codec_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The deterministic value of one DAC codec tensor: Snake α 1, codebooks N(0, 1), biases 0,
    convolutions N(0, 0.36 / fan_in) with ``fan_in`` = in-channels × kernel size; drawn by
    :func:`~omniduplex.models.qwen3_omni.presets.draw_tensor`."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "alpha":
        return torch.ones(shape)
    if name.endswith("codebook.weight"):
        return draw_tensor(name, shape, seed, 1.0)
    fan_in = shape[1] * shape[2] if len(shape) == 3 else 1
    return draw_tensor(name, shape, seed, 0.6 * fan_in**-0.5)


def unified_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name → shape for ``config`` (LM tensors, then ``codec.*``: decode and encode side;
    the quantizer's ``codebook``/``out_proj`` belong to both and appear once)."""
    cfg = UnifiedConfig.from_dict(config)
    shapes = published_shapes_of(UnifiedLM(cfg))
    for codec in (
        DacCodec(DacDecoderConfig.from_dict(cfg.codec_config)),
        DacCodecEncoder(DacEncoderConfig.from_dict(cfg.codec_config)),
    ):
        shapes.update({f"codec.{n}": tuple(t.shape) for n, t in codec.state_dict().items()})
    return shapes


def write_unified_checkpoint(
    out: str | Path, preset: str = "tiny", seed: int = 0, config: dict | None = None
) -> Path:
    """Write ``config.json``, ``model.safetensors`` and the tokenizer into ``out``; returns ``out``.

    ``config`` overrides the preset's dict (tests use variants). Deterministic: same arguments, same bytes.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = config or unified_config(preset)
    std = 0.02 if preset == "small" else 0.05
    tensors = {}
    for name, shape in sorted(unified_shapes(config).items()):
        tensors[name] = (
            draw_codec_tensor(name, shape, seed)
            if name.startswith("codec.")
            else draw_tensor(name, shape, seed, std)
        )
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "tokenizer.json").write_text(build_unified_tokenizer().to_str(pretty=True))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")
    return out
