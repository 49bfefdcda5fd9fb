"""Deterministic random-weight Fish Speech S2 Pro checkpoints in the published layout
(``init-model --arch fish-speech-tiny`` / ``fish-speech-small``).

Presets: ``tiny`` (tests), ``small`` (CPU benchmarks: the S2 Pro's slow-AR head size 128 and GQA 4:1, 10
codebooks of 1024, 8 slow layers of width 512, a 4-layer fast AR of width 256 behind ``fast_project_in``, so
that, as in S2 Pro (4B slow, 0.4B fast), a frame's 9 fast-AR steps weigh about what its one slow-AR step
does) and ``deep`` (parity tests only: 5 slow layers, untied
output head, a narrower fast AR behind ``fast_project_in``, q/k norms and biases in the fast AR). All keep the
published structure: 10 codebooks, a 4-layer fast AR, the codec at 44.1 kHz with 2048 samples per frame
(~21.5 frames/s, as S2 Pro's codec; :data:`HOP`).

Tokenizer: the presets' byte tokenizer (:func:`~omniduplex.models.tokenizer.build_byte_tokenizer`) plus
``<|voice|>``, ``<|speaker:0|>`` and one ``<|semantic:k|>`` per code of codebook 0
(``semantic_start_token_id`` is ``<|semantic:0|>``), the vocabulary padded to a multiple of 64.

Every tensor is drawn by :func:`~omniduplex.models.qwen3_omni.presets.draw_tensor` from a generator seeded by
``(seed, tensor name)``, so files are byte-identical across runs; norm weights are 1 + N(0, 0.1²) (not all
ones, so the q/k-norm reordering of the loader is exercised), biases N(0, 0.02²), and codec tensors as the
unified preset's (Snake α 1, codebooks N(0, 1), convs N(0, 0.36 / fan_in): a waveform O(0.1)).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniduplex.models.codecs.dac import DacCodec, DacDecoderConfig
from omniduplex.models.codecs.dac_encoder import DacCodecEncoder, DacEncoderConfig
from omniduplex.models.fish_speech.config import CODEC_DIR, MODEL_TYPE, SAMPLE_RATE, FishConfig
from omniduplex.models.fish_speech.model import FishLM, published_shapes
from omniduplex.models.qwen3_omni.presets import draw_tensor
from omniduplex.models.tokenizer import build_byte_tokenizer, preset_token_ids
from omniduplex.models.unified.presets import draw_codec_tensor

PRESETS = ("tiny", "small", "deep")
FISH_SPECIAL_TOKENS = ["<|voice|>", "<|speaker:0|>"]
NUM_CODEBOOKS = 10
HOP = [16, 128]
"""The codec's downsampling ratios: 2048 samples per frame at 44.1 kHz. Two upsampling blocks keep the
centred decoder's look-ahead at 4 frames ([4, 8, 8, 8], DAC's usual depth, needs 10 before the first sample
is final)."""


def _sizes(preset: str) -> dict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(PRESETS)}")
    return {
        #        slow: dim layers heads kv head_dim inter | fast: dim heads kv head_dim inter | codebook
        "tiny": dict(slow=(64, 2, 4, 2, 16, 128), fast=(64, 4, 2, 16, 128), codebook=64, enc=4, dec=32),
        "small": dict(
            slow=(512, 8, 4, 1, 128, 1536), fast=(256, 4, 1, 64, 768), codebook=1024, enc=8, dec=64
        ),
        "deep": dict(slow=(96, 5, 8, 2, 16, 192), fast=(64, 4, 1, 16, 128), codebook=64, enc=4, dec=32),
    }[preset]


def fish_tokenizer(codebook_size: int):
    """The preset tokenizer (module docstring)."""
    tok = build_byte_tokenizer()
    tok.add_special_tokens(FISH_SPECIAL_TOKENS + [f"<|semantic:{k}|>" for k in range(codebook_size)])
    return tok


def fish_config(preset: str) -> dict:
    """``config.json`` of a preset, in the published keys. Raises ValueError for an unknown preset."""
    z = _sizes(preset)
    ids = preset_token_ids()
    cb = z["codebook"]
    semantic_begin = 256 + len(ids) + len(FISH_SPECIAL_TOKENS)
    vocab = -(-(semantic_begin + cb) // 64) * 64
    dim, layers, heads, kv, hd, inter = z["slow"]
    text = dict(
        model_type="fish_qwen3",
        dim=dim,
        n_layer=layers,
        n_head=heads,
        n_local_heads=kv,
        head_dim=hd,
        intermediate_size=inter,
        vocab_size=vocab,
        max_seq_len=4096,
        rope_base=1_000_000,
        norm_eps=1e-6,
        attention_qkv_bias=False,
        attention_o_bias=False,
        attention_qk_norm=True,
        tie_word_embeddings=preset != "deep",
        dropout=0.0,
    )
    fdim, fheads, fkv, fhd, finter = z["fast"]
    fast = dict(
        model_type="fish_qwen3_audio_decoder",
        dim=fdim,
        n_layer=4,
        n_head=fheads,
        n_local_heads=fkv,
        head_dim=fhd,
        intermediate_size=finter,
        vocab_size=cb,
        num_codebooks=NUM_CODEBOOKS,
        max_seq_len=NUM_CODEBOOKS + 1,
        text_dim=dim,
        rope_base=1_000_000,
        norm_eps=1e-6,
        attention_qkv_bias=preset == "deep",
        attention_o_bias=preset == "deep",
        attention_qk_norm=preset == "deep",
        tie_word_embeddings=False,
    )
    return dict(
        architectures=["FishQwen3OmniForCausalLM"],
        model_type=MODEL_TYPE,
        text_config=text,
        audio_decoder_config=fast,
        semantic_start_token_id=semantic_begin,
        semantic_end_token_id=semantic_begin + cb - 1,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        audio_pad_token_id=ids["<|audio_pad|>"],
        dtype="float32",
    )


def codec_config(preset: str) -> dict:
    """``codec/config.json`` of a preset: a ``DacConfig`` dict (10 codebooks, 44.1 kHz, hop 2048)."""
    z = _sizes(preset)
    return dict(
        model_type="dac",
        encoder_hidden_size=z["enc"],
        downsampling_ratios=HOP,
        decoder_hidden_size=z["dec"],
        n_codebooks=NUM_CODEBOOKS,
        codebook_size=z["codebook"],
        codebook_dim=8,
        sampling_rate=SAMPLE_RATE,
    )


def _draw(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    if len(shape) == 1 and name.endswith("norm.weight"):
        return 1.0 + draw_tensor(name, (1, *shape), seed, 0.1)[0]
    if name.endswith(".bias"):
        return draw_tensor(name, (1, *shape), seed, 0.02)[0]
    return draw_tensor(name, shape, seed, std)


def write_fish_checkpoint(out: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write ``config.json``, ``model.safetensors``, the tokenizer and ``codec/`` (config + decoder and
    encoder weights). Deterministic: the same arguments give the same bytes. Returns ``out``."""
    cfg, ccfg = fish_config(preset), codec_config(preset)  # raises before anything is written
    out = Path(out)
    (out / CODEC_DIR).mkdir(parents=True, exist_ok=True)
    std = 0.02 if preset == "small" else 0.1
    shapes = published_shapes(FishLM(FishConfig.from_dict(cfg)))
    lm = {n: _draw(n, s, seed, std) for n, s in sorted(shapes.items())}
    codec = {}
    for m in (DacCodec(DacDecoderConfig.from_dict(ccfg)), DacCodecEncoder(DacEncoderConfig.from_dict(ccfg))):
        codec.update({n: draw_codec_tensor(n, tuple(t.shape), seed) for n, t in m.state_dict().items()})
    save_file(lm, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(
        dict(sorted(codec.items())), str(out / CODEC_DIR / "model.safetensors"), metadata={"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / CODEC_DIR / "config.json").write_text(json.dumps(ccfg, indent=2, sort_keys=True) + "\n")
    (out / "tokenizer.json").write_text(fish_tokenizer(cfg["audio_decoder_config"]["vocab_size"]).to_str())
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": cfg["text_config"]["max_seq_len"],
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")
    return out
