"""Deterministic random-weight Higgs Audio v3 checkpoints in the published layout
(``init-model --arch higgs-tiny|higgs-small``).

Presets: ``tiny`` (tests), ``small`` (CPU benchmarks; the published tied audio head), ``deep`` (parity only:
4 layers, GQA 4:1). ``tiny`` and ``deep`` untie the audio head (``audio_encoder_config.tie_word_embeddings``
false): with random weights a tied head feeds back its own codes and repeats one frame forever. All keep
the published codec interface: 8 codebooks of 1026 ids (1024 codes + BOC + EOC) and
the tokenizer's 960-sample hop at 24 kHz (25 frames/s, ratios ``[8, 5, 4, 2, 3]``); the backbone and the
codec's channel widths are shrunk. The folder holds ``config.json`` + ``model.safetensors`` (``tied.*``,
``body.*`` and the unused text head ``tied.head.text_head.weight``, as published), a byte-level
``tokenizer.json`` with the v3 specials, ``audio_tokenizer/`` (a ``higgs_audio_v2_tokenizer`` config and
its decode-side tensors) and ``voices.json`` (two built-in voices of random codes).

Every tensor is drawn from a generator seeded by ``(seed, tensor name)``
(:func:`omniduplex.models.qwen3_omni.presets.draw_tensor`): embeddings N(0, 0.3²), other matrices N(0, std²)
(0.1; 0.05 for ``small``), so the codes vary from step to step and depend on the whole prompt; the codec's
convolutions N(0, 0.5 / fan_in) (output conv 0.004 / fan_in) with
Snake α = 1, so the waveform is neither silent nor clipped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniduplex.models.checkpoint import published_shapes_of
from omniduplex.models.higgs.codec import HiggsCodecDecoder
from omniduplex.models.higgs.config import ARCHITECTURE, CODEC_DIR, MODEL_TYPE, HiggsCodecConfig, HiggsConfig
from omniduplex.models.higgs.prompt import SPECIAL_TOKENS, VOICES_FILE
from omniduplex.models.higgs.talker import HiggsTalker
from omniduplex.models.qwen3_omni.presets import decoder_config, draw_tensor
from omniduplex.models.tokenizer import build_byte_tokenizer

PRESETS = ("tiny", "small", "deep")
VOICES = {
    "belinda": "It was the night before my birthday, and the house was finally quiet.",
    "en_man": "Good morning. The train to the coast leaves from platform four.",
}


def build_tokenizer():
    """The presets' byte-level tokenizer plus the v3 specials (:data:`~.prompt.SPECIAL_TOKENS`)."""
    tok = build_byte_tokenizer()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def higgs_config(preset: str) -> dict:
    """``config.json`` of a preset (published keys). Raises ValueError for an unknown preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESETS)}")
    h, layers, heads, kv, hd, inter, vocab = {
        "tiny": (64, 2, 4, 2, 16, 128, 288),
        "small": (256, 6, 8, 2, 32, 768, 2048),
        "deep": (128, 4, 8, 2, 32, 256, 288),
    }[preset]
    text = decoder_config(
        h,
        layers,
        heads,
        kv,
        hd,
        inter,
        vocab,
        model_type="qwen3",
        rope_theta=None,  # as published: Qwen3's 1e6 applies
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    audio = dict(
        encoder_type="discrete",
        num_codebooks=8,
        vocab_size=1026,
        out_dim=h,
        tie_word_embeddings=preset == "small",
        use_delay_pattern=True,
        model_type="higgs_audio_encoder",
    )
    return dict(
        architectures=[ARCHITECTURE],
        model_type=MODEL_TYPE,
        text_config=text,
        audio_encoder_config=audio,
        audio_token_id=-100,
        mel_per_sample=8,
        audio_tokenizer_id="bosonai/higgs-audio-v2-tokenizer",
        sample_rate=24000,
        torch_dtype="float32",
    )


def codec_config(preset: str) -> dict:
    """``audio_tokenizer/config.json`` (``HiggsAudioV2TokenizerConfig`` keys) of a preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESETS)}")
    dec, acoustic, sem, cdim = {"tiny": (64, 16, 32, 8), "small": (128, 32, 64, 16), "deep": (64, 16, 32, 8)}[
        preset
    ]
    ratios = [8, 5, 4, 2, 3]
    return dict(
        architectures=["HiggsAudioV2TokenizerModel"],
        model_type="higgs_audio_v2_tokenizer",
        acoustic_model_config=dict(
            model_type="dac",
            encoder_hidden_size=4,
            downsampling_ratios=ratios,
            upsampling_ratios=ratios,
            decoder_hidden_size=dec,
            hidden_size=acoustic,
            sampling_rate=24000,
        ),
        semantic_model_config=dict(
            model_type="hubert",
            hidden_size=sem,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=2 * sem,
            conv_dim=[8, 8],
            conv_stride=[5, 2],
            conv_kernel=[10, 3],
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
        ),
        codebook_size=1024,
        codebook_dim=cdim,
        target_bandwidths=[0.5, 1, 1.5, 2],
        sample_rate=24000,
    )


def _draw_talker(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    return draw_tensor(name, shape, seed, 0.3 if "embedding" in name else std)


def _draw_codec(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    if name.endswith("alpha"):
        return torch.ones(shape)
    if name.endswith("codebook.embed"):
        return draw_tensor(name, shape, seed, 1.0)
    if len(shape) == 1:
        return torch.zeros(shape)
    fan_in = 2 * shape[0] if name.endswith("conv_t1.weight") else math.prod(shape[1:])  # k = 2·stride
    gain = 0.004 if name.endswith("conv2.weight") and shape[0] == 1 else 0.5
    return draw_tensor(name, shape, seed, math.sqrt(gain / fan_in))


def write_higgs_checkpoint(out: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the preset's folder (module docstring). Deterministic: the same arguments give the same bytes.
    Returns ``out``. Raises ValueError for an unknown preset (before anything is written)."""
    raw, craw = higgs_config(preset), codec_config(preset)
    cfg, ccfg = HiggsConfig.from_dict(raw), HiggsCodecConfig.from_dict(craw)
    out = Path(out)
    (out / CODEC_DIR).mkdir(parents=True, exist_ok=True)
    std = 0.05 if preset == "small" else 0.1
    shapes = published_shapes_of(HiggsTalker(cfg))
    if cfg.tie_audio_embeddings:
        shapes.pop("tied.head.modality_heads.0.weight")
    shapes["tied.head.text_head.weight"] = (cfg.text.vocab_size, cfg.text.hidden_size)
    main = {n: _draw_talker(n, s, seed, std) for n, s in shapes.items()}
    codec = {n: _draw_codec(n, s, seed) for n, s in published_shapes_of(HiggsCodecDecoder(ccfg)).items()}
    save_file(dict(sorted(main.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(
        dict(sorted(codec.items())), str(out / CODEC_DIR / "model.safetensors"), metadata={"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    (out / CODEC_DIR / "config.json").write_text(json.dumps(craw, indent=2, sort_keys=True) + "\n")
    tok = build_tokenizer()
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True))
    frames = 25 if preset == "tiny" else 50
    g = torch.Generator().manual_seed(seed + 1)
    voices = {
        name: {
            "text": text,
            "codes": torch.randint(0, cfg.codebook_size, (frames, cfg.num_codebooks), generator=g).tolist(),
        }
        for name, text in VOICES.items()
    }
    (out / VOICES_FILE).write_text(json.dumps(voices, sort_keys=True) + "\n")
    return out
