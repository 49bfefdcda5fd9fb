"""Deterministic random-weight Qwen3-TTS checkpoints in the published layout
(``init-model --arch qwen3-tts``).

Presets: ``tiny`` (tests), ``small`` (CPU benchmarks) and ``heldout`` (parity only: deeper, GQA 4:1, a
predictor narrower than the talker so ``small_to_mtp_projection`` exists, the 151936-row text table of
the published models). All keep the published codec vocabulary (3072 talker ids: codes 0..2047, control
ids above), 16 codebooks of 2048 and the 12 Hz codec's rates (1920 samples per frame at 24 kHz); control,
language and speaker ids follow the published 0.6B configs. Variants (``tts_model_type``): ``base``
(speaker encoder), ``custom_voice`` (named speakers, two of them dialect speakers), ``voice_design``.

Every tensor is drawn by :func:`~omniduplex.models.qwen3_omni.presets.draw_tensor` from a generator seeded
by ``(seed, tensor name)``, so files are byte-identical across runs and shared tensors are equal across
variants. Codebooks (``embedding_sum``) are N(0, 1), conv / codec weights N(0, 0.36 / fan_in) (the output
conv N(0, 36 / fan_in)) and the codec transformer's layer scales 0.5, so the random codec is neither silent
(the reference initialises codebooks to zero) nor clipped, and its transformer context visibly matters
(a streamed decode differs from a whole one by tens of LSB).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniduplex.models.checkpoint import published_shapes_of
from omniduplex.models.qwen3_omni.presets import SPEECH_TEXT_IDS, decoder_config, draw_tensor
from omniduplex.models.qwen3_tts.config import ARCHITECTURE, CODEC_ARCHITECTURE, VARIANTS
from omniduplex.models.qwen3_tts.model import CODEC_DIR, build_modules
from omniduplex.models.tokenizer import preset_token_ids, write_tokenizer

PRESETS = ("tiny", "small", "heldout")
_IDS = preset_token_ids()
# control / language / speaker ids of the published Qwen3-TTS-12Hz-0.6B configs (codec vocabulary 3072)
CODEC_IDS = dict(
    codec_pad_id=2148,
    codec_bos_id=2149,
    codec_eos_token_id=2150,
    codec_think_id=2154,
    codec_nothink_id=2155,
    codec_think_bos_id=2156,
    codec_think_eos_id=2157,
)
LANGUAGES = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
SPEAKERS = {"serena": 3066, "vivian": 3065, "ryan": 3061, "aiden": 2861, "eric": 2875, "dylan": 2878}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}


def tts_config(preset: str, variant: str = "custom_voice") -> dict:
    """``config.json`` of a preset and variant. Raises ValueError for an unknown preset or variant."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESETS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {list(VARIANTS)}")
    h, layers, heads, kv, hd, inter, th, tv = {
        "tiny": (64, 2, 4, 2, 16, 128, 32, 272),
        "small": (256, 6, 8, 2, 32, 768, 128, 2048),
        "heldout": (128, 4, 8, 2, 32, 256, 64, 151936),
    }[preset]
    ph, pl, pi = {"tiny": (64, 2, 128), "small": (256, 3, 512), "heldout": (64, 5, 128)}[preset]
    groups = 16
    predictor = decoder_config(ph, pl, 4, 2, 16, pi, 2048, num_code_groups=groups, rope_theta=1_000_000.0)
    talker = decoder_config(h, layers, heads, kv, hd, inter, 3072)
    talker.update(
        rope_scaling={
            "rope_type": "default",
            "mrope_section": [hd // 8, 3 * hd // 16, 3 * hd // 16],
            "interleaved": True,
        },
        code_predictor_config=predictor,
        num_code_groups=groups,
        text_hidden_size=th,
        text_vocab_size=tv,
        codec_language_id=LANGUAGES,
        position_id_per_seconds=13,
        **CODEC_IDS,
    )
    if variant == "custom_voice":
        talker.update(spk_id=SPEAKERS, spk_is_dialect={s: DIALECTS.get(s, False) for s in SPEAKERS})
    else:
        talker.update(spk_id={}, spk_is_dialect={})
    cfg = dict(
        architectures=[ARCHITECTURE],
        model_type="qwen3_tts",
        tts_model_type=variant,
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size=preset,
        talker_config=talker,
        **SPEECH_TEXT_IDS,
        torch_dtype="float32",
    )
    if variant == "base":
        ch = {"tiny": 32, "small": 128, "heldout": 64}[preset]
        cfg["speaker_encoder_config"] = dict(
            mel_dim=128,
            enc_dim=h,
            enc_channels=[ch, ch, ch, ch, 3 * ch],
            enc_kernel_sizes=[5, 3, 3, 3, 1],
            enc_dilations=[1, 2, 3, 4, 1],
            enc_attention_channels=16,
            enc_res2net_scale=8,
            enc_se_channels=16,
            sample_rate=24000,
        )
    return cfg


def codec_config(preset: str) -> dict:
    """``speech_tokenizer/config.json`` of a preset (Mimi-style encoder + the 12 Hz decoder)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESETS)}")
    hidden, latent, cdim, layers, inter, ddim = {
        "tiny": (32, 48, 32, 2, 64, 32),
        "small": (128, 256, 128, 4, 256, 256),
        "heldout": (64, 96, 64, 8, 128, 96),
    }[preset]
    decoder = dict(
        codebook_size=2048,
        codebook_dim=cdim,
        hidden_size=hidden,
        latent_dim=latent,
        max_position_embeddings=8000,
        rope_theta=10000.0,
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_bias=False,
        sliding_window=72,
        intermediate_size=inter,
        hidden_act="silu",
        layer_scale_initial_scale=0.01,
        rms_norm_eps=1e-5,
        num_hidden_layers=layers,
        num_quantizers=16,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=ddim,
        attention_dropout=0.0,
    )
    hidden, filters, layers, quantizers = {
        "tiny": (32, 4, 2, 16),
        "small": (128, 16, 4, 32),
        "heldout": (64, 8, 2, 32),
    }[preset]
    encoder = dict(
        sampling_rate=24000,
        frame_rate=12.5,
        audio_channels=1,
        hidden_size=hidden,
        num_filters=filters,
        num_residual_layers=1,
        upsampling_ratios=[8, 6, 5, 4],
        kernel_size=7,
        last_kernel_size=3,
        residual_kernel_size=3,
        dilation_growth_rate=2,
        use_causal_conv=True,
        pad_mode="constant",
        compress=2,
        codebook_size=2048,
        codebook_dim=16,
        num_quantizers=quantizers,
        use_conv_shortcut=False,
        vector_quantization_hidden_dimension=16,
        num_semantic_quantizers=1,
        upsample_groups=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=4,
        hidden_act="gelu",
        max_position_embeddings=8000,
        norm_eps=1e-5,
        rope_theta=10000.0,
        sliding_window=250,
        layer_scale_initial_scale=0.01,
        attention_bias=False,
    )
    return dict(
        architectures=[CODEC_ARCHITECTURE],
        encoder_config=encoder,
        model_type="qwen3_tts_tokenizer_12hz",
        decoder_config=decoder,
        encoder_valid_num_quantizers=16,
        input_sample_rate=24000,
        output_sample_rate=24000,
        decode_upsample_rate=1920,
        encode_downsample_rate=1920,
    )


def _draw(name: str, shape: tuple[int, ...], seed: int, std: float) -> object:
    if name.endswith("embedding_sum"):
        return draw_tensor(name, shape, seed, 1.0)
    if name.startswith(f"{CODEC_DIR}/") and name.endswith("layer_scale.scale"):
        return torch.full(shape, 0.5)
    codec_like = name.startswith((f"{CODEC_DIR}/", "speaker_encoder."))
    if codec_like and len(shape) >= 2:
        gain = 6.0 if shape[0] == 1 else 0.6  # the codec's output conv: waveform O(0.03), peaks O(0.3)
        return draw_tensor(name, shape, seed, gain / math.sqrt(math.prod(shape[1:])))
    return draw_tensor(name, shape, seed, std)


def write_tts_checkpoint(
    out: str | Path, preset: str = "tiny", seed: int = 0, variant: str = "custom_voice"
) -> Path:
    """Write ``config.json``, ``model.safetensors``, the tokenizer and ``speech_tokenizer/`` (config + decoder
    weights). Deterministic: the same arguments give the same bytes. Returns ``out``."""
    cfg, ccfg = tts_config(preset, variant), codec_config(preset)  # raises before anything is written
    out = Path(out)
    (out / CODEC_DIR).mkdir(parents=True, exist_ok=True)
    std = 0.02 if preset == "small" else 0.05
    main, codec = {}, {}
    for prefix, module in build_modules(cfg, ccfg).items():
        for n, s in published_shapes_of(module).items():
            t = _draw(prefix + n, s, seed, std)
            if prefix.startswith(f"{CODEC_DIR}/"):
                codec[prefix[len(CODEC_DIR) + 1 :] + n] = t
            else:
                main[prefix + n] = t
    save_file(dict(sorted(main.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(
        dict(sorted(codec.items())), str(out / CODEC_DIR / "model.safetensors"), metadata={"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / CODEC_DIR / "config.json").write_text(json.dumps(ccfg, indent=2, sort_keys=True) + "\n")
    write_tokenizer(out)
    return out
