"""Deterministic random-weight checkpoints in the published Qwen3-Omni layout (``init-model``).

``tiny`` is for tests and the out-of-the-box run; ``small`` (~80M parameters) for CPU benchmarks.
Every tensor is drawn from a generator seeded by ``(seed, tensor name)``, so a checkpoint is
byte-identical across runs and independent of module construction order. Values: norm weights 1,
biases 0, SnakeBeta log-scale parameters 0, layer scales 0.01, matrices N(0, std²).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniduplex.models.checkpoint import published_shapes_of
from omniduplex.models.tokenizer import preset_token_ids, write_tokenizer

_IDS = preset_token_ids()
CODEBOOK = {"tiny": 256, "small": 1024}
SPEECH_TEXT_IDS = dict(
    im_start_token_id=_IDS["<|im_start|>"],
    im_end_token_id=_IDS["<|im_end|>"],
    tts_pad_token_id=_IDS["<tts_pad>"],
    tts_bos_token_id=_IDS["<tts_text_bos>"],
    tts_eos_token_id=_IDS["<tts_text_eod>"],
)
"""The chat-turn and TTS text-channel token ids of the preset tokenizer, under the top-level ``config.json``
keys that Qwen3-Omni and Qwen3-TTS both publish."""


def decoder_config(
    hidden, layers, heads, kv, head_dim, inter, vocab, experts=0, topk=0, moe_inter=0, **extra
) -> dict:
    """A Qwen3-style decoder ``config.json`` section (SiLU, RMSNorm 1e-6, RoPE θ 1e6, no attention bias) of
    the given sizes; with ``experts`` a sparse MoE in every layer; ``extra`` keys override."""
    d = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        attention_bias=False,
        max_position_embeddings=32768,
    )
    if experts:
        d.update(
            num_experts=experts,
            num_experts_per_tok=topk,
            moe_intermediate_size=moe_inter,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
    d.update(extra)
    return d


def omni_config(preset: str) -> dict:
    """The HF ``config.json`` dict of a preset (``Qwen3OmniMoeForConditionalGeneration``)."""
    if preset not in CODEBOOK:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(CODEBOOK)}")
    tiny = preset == "tiny"
    cb = CODEBOOK[preset]
    groups = 4 if tiny else 8
    th = 64 if tiny else 512
    tk = 64 if tiny else 256
    text = decoder_config(
        th,
        2 if tiny else 8,
        4 if tiny else 8,
        2 if tiny else 4,
        16 if tiny else 64,
        128 if tiny else 1024,
        272 if tiny else 8192,
        experts=4 if tiny else 8,
        topk=2,
        moe_inter=32 if tiny else 512,
    )
    text["rope_scaling"] = {
        "rope_type": "default",
        "mrope_section": [2, 3, 3] if tiny else [12, 10, 10],
        "interleaved": True,
        "mrope_interleaved": True,
    }
    audio = dict(
        d_model=32 if tiny else 256,
        encoder_layers=2 if tiny else 4,
        encoder_attention_heads=4,
        encoder_ffn_dim=64 if tiny else 1024,
        num_mel_bins=128,
        max_source_positions=1500,
        n_window=50,
        n_window_infer=800,
        output_dim=th,
        downsample_hidden_size=16 if tiny else 64,
        activation_function="gelu",
        conv_chunksize=500,
        scale_embedding=False,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    talker_text = decoder_config(
        tk,
        2 if tiny else 4,
        4,
        2,
        16 if tiny else 64,
        128 if tiny else 512,
        cb + 1024,
        experts=4,
        topk=2,
        moe_inter=32 if tiny else 256,
        shared_expert_intermediate_size=64 if tiny else 256,
    )
    talker_text["norm_topk_prob"] = False
    talker_text["rope_scaling"] = dict(text["rope_scaling"])
    predictor = decoder_config(
        tk, 2, 4, 2, 16 if tiny else 64, 128 if tiny else 512, cb, num_code_groups=groups
    )
    code2wav = dict(
        codebook_size=cb,
        hidden_size=64 if tiny else 256,
        max_position_embeddings=8000,
        rope_theta=10000.0,
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_bias=False,
        sliding_window=8 if tiny else 32,
        intermediate_size=128 if tiny else 512,
        hidden_act="silu",
        layer_scale_initial_scale=0.01,
        rms_norm_eps=1e-5,
        num_hidden_layers=2 if tiny else 4,
        num_quantizers=groups,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=64 if tiny else 256,
        attention_dropout=0.0,
    )
    talker = dict(
        text_config=talker_text,
        code_predictor_config=predictor,
        num_code_groups=groups,
        thinker_hidden_size=th,
        accept_hidden_layer=1 if tiny else 4,
        codec_pad_id=cb + 100,
        codec_bos_id=cb + 101,
        codec_eos_token_id=cb + 102,
        codec_nothink_id=cb + 107,
        codec_think_bos_id=cb + 108,
        codec_think_eos_id=cb + 109,
        speaker_id={"ethan": cb + 200, "chelsie": cb + 201, "aiden": cb + 202},
        audio_token_id=_IDS["<|audio_pad|>"],
        image_token_id=_IDS["<|image_pad|>"],
        video_token_id=_IDS["<|video_pad|>"],
        vision_start_token_id=_IDS["<|vision_start|>"],
        audio_start_token_id=_IDS["<|audio_start|>"],
        position_id_per_seconds=25,
        spatial_merge_size=2,
    )
    thinker = dict(
        text_config=text,
        audio_config=audio,
        audio_token_id=_IDS["<|audio_pad|>"],
        audio_start_token_id=_IDS["<|audio_start|>"],
        audio_end_token_id=_IDS["<|audio_end|>"],
        image_token_id=_IDS["<|image_pad|>"],
        video_token_id=_IDS["<|video_pad|>"],
        vision_start_token_id=_IDS["<|vision_start|>"],
        user_token_id=_IDS["<|user|>"],
        position_id_per_seconds=25,
        tie_word_embeddings=False,
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=th,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            deepstack_visual_indexes=[0],
        ),
    )
    return dict(
        architectures=["Qwen3OmniMoeForConditionalGeneration"],
        model_type="qwen3_omni_moe",
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        **SPEECH_TEXT_IDS,
        system_token_id=_IDS["<|system|>"],
        user_token_id=_IDS["<|user|>"],
        assistant_token_id=_IDS["<|assistant|>"],
        torch_dtype="float32",
    )


def text_config(preset: str) -> dict:
    """A ``Qwen3MoeForCausalLM`` config with the preset's Thinker text decoder (for engine benchmarks)."""
    text = copy.deepcopy(omni_config(preset)["thinker_config"]["text_config"])
    text.pop("rope_scaling")
    text.update(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        tie_word_embeddings=False,
        torch_dtype="float32",
        bos_token_id=_IDS["<|endoftext|>"],
        eos_token_id=_IDS["<|im_end|>"],
    )
    return text


def draw_tensor(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    """The deterministic value of one checkpoint tensor (see module docstring)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("alpha", "beta"):
        return torch.zeros(shape)
    if leaf == "scale" or name.endswith("layer_scale.scale"):
        return torch.full(shape, 0.01)
    if leaf == "bias":
        return torch.zeros(shape)
    if len(shape) == 1:
        return torch.ones(shape)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return torch.randn(shape, generator=g) * std


def published_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Published tensor name → shape of every weight our modules need for ``config``."""
    from omniduplex.models.registry import build_modules  # local: avoid a cycle at import time

    shapes = {}
    for prefix, module in build_modules(config).items():
        shapes.update({prefix + n: s for n, s in published_shapes_of(module).items()})
    return shapes


def write_checkpoint(
    out: str | Path, preset: str = "tiny", seed: int = 0, text_only: bool = False, config: dict | None = None
) -> Path:
    """Write ``config.json``, ``model.safetensors``, the tokenizer and ``preprocessor_config.json``.

    ``config`` overrides the preset's config dict (tests use variants: other layer counts, GQA ratios,
    top-k). Returns the output directory. Deterministic: the same arguments give the same bytes.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = text_config(preset) if text_only else omni_config(preset)
    std = 0.02 if preset == "small" else 0.05
    shapes = published_shapes(config)
    tensors = {n: draw_tensor(n, s, seed, std) for n, s in sorted(shapes.items())}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_tokenizer(out)
    pre = dict(
        feature_extractor_type="WhisperFeatureExtractor",
        feature_size=128,
        sampling_rate=16000,
        hop_length=160,
        n_fft=400,
        chunk_length=300,
        n_samples=4800000,
        nb_max_frames=30000,
        padding_side="right",
        padding_value=0.0,
        return_attention_mask=True,
        dither=0.0,
    )
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2, sort_keys=True) + "\n")
    return out
