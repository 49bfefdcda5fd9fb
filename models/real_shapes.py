"""The seed models at their published sizes, random weights built on the target device (``real`` presets).

Speed is measured at the real shapes without a download: :func:`write_real_dir` writes only ``config.json``
(and the tokenizer) plus the marker :data:`~.random_init.MARKER`; the loaders (:func:`~.registry.load_model`,
:func:`~.qwen3_tts.model.load_qwen3_tts`) then build every module directly on the device in the serving dtype
and fill it in place (:func:`~.random_init.random_init_`), seconds instead of minutes, nothing on disk.

Where each number comes from (``transformers`` 5.19's config classes carry generic defaults, not these
models': ``Qwen3Config`` defaults to an 8B-like 4096 × 32, so the published ``config.json`` fields are used):

- ``qwen3-omni-30b-a3b``: ``Qwen/Qwen3-Omni-30B-A3B-Instruct`` ``config.json`` (``Qwen3OmniMoeConfig`` dump,
  transformers 5.7): Thinker text 48 layers, hidden 2048, 32 q / 4 kv heads of 128, 128 experts top-8 of
  768, vocab 152064; audio tower 32 layers, d_model 1280, 20 heads, ffn 5120, output 2048, conv 480; Talker
  20 layers, hidden 1024, 16 / 2 heads of 128, 128 experts top-6 of 384 + a shared expert of 768, vocab
  3072, ``accept_hidden_layer`` 24, 16 code groups; code predictor 5 layers, hidden 1024, 16 / 8 heads,
  ffn 3072, vocab 2048; Code2Wav 8 layers, hidden 1024, 16 heads, ffn 3072, window 72, decoder_dim 1536,
  rates [8, 5, 4, 3] × [2, 2]. The vision encoder (27 blocks, ~0.54B) is not built (speech graphs only).
- ``qwen3-tts-12hz-1.7b``: ``Qwen/Qwen3-TTS-12Hz-1.7B-*`` ``config.json``: talker 28 layers, hidden 2048, 16
  / 8 heads of 128, ffn 6144, codec vocab 3072, text vocab 151936 × 2048; code predictor 5 layers, hidden
  1024, 16 / 8 heads of 128, ffn 3072. The 12 Hz decoder: ``Qwen3TTSTokenizerV2DecoderConfig``'s defaults
  (qwen-tts 0.1.1; our :class:`~.qwen3_tts.config.CodecDecoderConfig`) with ``codebook_dim`` 512.
- ``qwen3-0.6b``: ``Qwen/Qwen3-0.6B`` ``config.json``: 28 layers, hidden 1024, 16 / 8 heads of 128, ffn
  3072, vocab 151936, tied embeddings.
- ``qwen2.5-7b``: ``Qwen/Qwen2.5-7B`` ``config.json``: 28 layers, hidden 3584, 28 / 4 heads, ffn 18944,
  vocab 152064, q/k/v biases, untied.

Checked against vLLM-Omni (``vllm-project/vllm-omni``): its stage configs (``qwen3_omni_moe.yaml``) name the
same checkpoints and split them into the same stages (Thinker, Talker, Code2Wav); they carry engine settings,
not shapes, so the shapes above are the checkpoints' own.

Special token ids are those of our preset tokenizer (as the other presets), so the pipeline's prompt
builders run unchanged; codec control ids keep the published values. ``depth`` caps the layer count of every
stack (same widths), for CPU runs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from omniduplex.models.qwen3_omni.presets import decoder_config, omni_config, text_config
from omniduplex.models.qwen3_tts.presets import codec_config, tts_config
from omniduplex.models.random_init import MARKER
from omniduplex.models.tokenizer import write_tokenizer

REAL = ("qwen3-omni-30b-a3b", "qwen3-tts-12hz-1.7b", "qwen3-0.6b", "qwen2.5-7b")
PUBLISHED_PARAMS = {
    "qwen3-omni-30b-a3b/thinker-text": 30_532_122_624 + (152064 - 151936) * 2048 * 2,
    "qwen3-0.6b": 596_049_920,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-tts-12hz-1.7b/non-embedding": 1_700_000_000,
}
"""Published totals: Qwen3-30B-A3B 30,532,122,624 (keras-hub preset metadata; the Thinker's text model has
its 152064-row vocabulary, 128 rows × 2048 × 2 tables more); Qwen3-0.6B "0.6B, 0.44B non-embedding" and
Qwen2.5-7B "7.61B, 6.53B non-embedding" (model cards; the exact sums of their config.json shapes); Qwen3-TTS
"1.7B" (the name; the talker without its 151936 × 2048 text table)."""
TOLERANCE = {"qwen3-tts-12hz-1.7b/non-embedding": 0.10}
"""Relative tolerance of a count against :data:`PUBLISHED_PARAMS` (default 0.005; the TTS one is a name)."""


def _cap(n: int, depth: int | None) -> int:
    return n if depth is None else max(1, min(n, depth))


def _ids(raw: dict, keys: dict) -> None:
    for k, v in keys.items():
        if k in raw:
            raw[k] = v


def real_config(name: str, depth: int | None = None) -> dict | tuple[dict, dict]:
    """The ``config.json`` dict of a real preset (Qwen3-TTS: ``(config, speech_tokenizer config)``), every
    stack capped at ``depth`` layers. Raises ValueError for an unknown name or ``depth < 1``."""
    if name not in REAL:
        raise ValueError(f"unknown real preset {name!r}; choose from {list(REAL)}")
    if depth is not None and depth < 1:
        raise ValueError(f"depth={depth} must be >= 1")
    if name == "qwen3-omni-30b-a3b":
        return _omni(depth)
    if name == "qwen3-tts-12hz-1.7b":
        return _tts(depth)
    base = copy.deepcopy(text_config("tiny"))  # token ids of our tokenizer; every shape key is replaced
    if name == "qwen3-0.6b":
        shape = decoder_config(1024, _cap(28, depth), 16, 8, 128, 3072, 151936)
        base.update(shape, architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=True)
    else:
        shape = decoder_config(3584, _cap(28, depth), 28, 4, 128, 18944, 152064)
        base.update(shape, architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=False)
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
        base.pop(k, None)
    base["max_position_embeddings"] = 40960 if name == "qwen3-0.6b" else 32768
    base["torch_dtype"] = "bfloat16"
    return base


def _omni(depth: int | None) -> dict:
    cfg = omni_config("small")  # token ids and layout keys of our tokenizer; shapes replaced below
    layers = _cap(48, depth)
    text = decoder_config(2048, layers, 32, 4, 128, 768, 152064, experts=128, topk=8, moe_inter=768)
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True}
    th = cfg["thinker_config"]
    th["text_config"] = text
    th["audio_config"].update(
        d_model=1280,
        encoder_layers=_cap(32, depth),
        encoder_attention_heads=20,
        encoder_ffn_dim=5120,
        output_dim=2048,
        downsample_hidden_size=480,
    )
    th["vision_config"]["out_hidden_size"] = 2048
    talker_text = decoder_config(
        1024,
        _cap(20, depth),
        16,
        2,
        128,
        2048,
        3072,
        experts=128,
        topk=6,
        moe_inter=384,
        shared_expert_intermediate_size=768,
    )
    talker_text["rope_scaling"] = dict(text["rope_scaling"])
    predictor = decoder_config(1024, _cap(5, depth), 16, 8, 128, 3072, 2048, num_code_groups=16)
    tk = cfg["talker_config"]
    tk.update(
        text_config=talker_text,
        code_predictor_config=predictor,
        num_code_groups=16,
        thinker_hidden_size=2048,
        accept_hidden_layer=min(24, layers - 1),
        codec_pad_id=2148,
        codec_bos_id=2149,
        codec_eos_token_id=2150,
        codec_nothink_id=2155,
        codec_think_bos_id=2156,
        codec_think_eos_id=2157,
        speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303},
    )
    cfg["code2wav_config"].update(
        codebook_size=2048,
        hidden_size=1024,
        num_attention_heads=16,
        num_key_value_heads=16,
        sliding_window=72,
        intermediate_size=3072,
        num_hidden_layers=_cap(8, depth),
        num_quantizers=16,
        decoder_dim=1536,
    )
    cfg["torch_dtype"] = "bfloat16"
    return cfg


def _tts(depth: int | None) -> tuple[dict, dict]:
    cfg, codec = tts_config("tiny"), codec_config("tiny")  # ids and layout keys; shapes replaced below
    tk = cfg["talker_config"]
    shape = decoder_config(2048, _cap(28, depth), 16, 8, 128, 6144, 3072)
    tk.update(shape, text_hidden_size=2048, text_vocab_size=151936)
    tk["rope_scaling"] = {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True}
    tk["code_predictor_config"] = decoder_config(
        1024, _cap(5, depth), 16, 8, 128, 3072, 2048, num_code_groups=16, rope_theta=1_000_000.0
    )
    cfg.update(tts_model_size="1b7", torch_dtype="bfloat16")
    codec["decoder_config"].update(
        codebook_dim=512,
        hidden_size=1024,
        latent_dim=1024,
        num_attention_heads=16,
        num_key_value_heads=16,
        intermediate_size=3072,
        num_hidden_layers=_cap(8, depth),
        decoder_dim=1536,
    )
    codec.pop("encoder_config")  # speech output only: no encoder (a Base voice prompt is not built)
    return cfg, codec


def write_real_dir(out: str | Path, name: str, depth: int | None = None, seed: int = 0) -> Path:
    """Write a weightless model directory for ``name``: ``config.json`` (+ ``speech_tokenizer/config.json``
    for Qwen3-TTS), the tokenizer and :data:`~.random_init.MARKER` (``{"seed": seed}``). Any loader of this
    project then builds the model on its device with random weights. Returns ``out``."""
    cfg = real_config(name, depth)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(cfg, tuple):
        from omniduplex.models.qwen3_tts.model import CODEC_DIR

        cfg, codec = cfg
        (out / CODEC_DIR).mkdir(exist_ok=True)
        (out / CODEC_DIR / "config.json").write_text(json.dumps(codec, indent=2, sort_keys=True) + "\n")
        (out / CODEC_DIR / MARKER).write_text(json.dumps({"seed": seed}) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / MARKER).write_text(json.dumps({"seed": seed, "preset": name, "depth": depth}) + "\n")
    write_tokenizer(out)
    return out


def parameter_counts(name: str, depth: int | None = None) -> dict[str, int]:
    """Parameter count of each built part at ``depth`` (``None``: the published depth), computed on the meta
    device (no memory, no time): ``{part: n}`` plus ``"total"``; Qwen3-Omni adds ``"thinker-text"`` (the
    Thinker without its audio tower), Qwen3-TTS ``"non-embedding"`` (the talker without its text table)."""
    cfg = real_config(name, depth)
    with torch.device("meta"):
        if isinstance(cfg, tuple):
            from omniduplex.models.qwen3_tts.model import build_modules as build_tts

            mods = build_tts(*cfg)
        else:
            from omniduplex.models.registry import build_modules

            mods = build_modules(cfg)
    out = {p.rstrip("."): sum(t.numel() for t in m.parameters()) for p, m in mods.items()}
    out = {(k or "lm"): v for k, v in out.items()}
    if "thinker" in out:
        tower = mods["thinker."].audio_tower
        out["thinker-text"] = out["thinker"] - sum(t.numel() for t in tower.parameters())
    if "talker" in out:
        text = getattr(mods["talker."].model, "text_embedding", None)
        if text is not None:
            out["non-embedding"] = out["talker"] - text.weight.numel()
    out["total"] = sum(v for k, v in out.items() if k not in ("thinker-text", "non-embedding"))
    return out


def memory_budget_gib(
    name: str, dtype: torch.dtype = torch.bfloat16, kv_tokens: int = 32 * 2048, fp8_thinker: bool = False
) -> dict:
    """Weights at ``dtype`` and the KV cache of the largest LM for ``kv_tokens`` cached tokens (bf16), GiB.
    Qwen3-Omni in bf16: ~64.7 GiB of weights + 6 GiB KV at 32 × 2048 tokens: fits one 80 GB H100 (78 GiB
    usable) without FP8; an FP8 Thinker is needed only past ~190k cached tokens. ``fp8_thinker``: the
    Thinker's LM linears and experts in e4m3 with per-channel scales (:mod:`omniduplex.kernels.fp8_linear`;
    its audio tower, embedding and LM head stay at ``dtype``); adds ``"fp8_thinker_gib"``, what they take."""
    counts = parameter_counts(name)
    size = torch.empty((), dtype=dtype).element_size()
    weights = counts["total"] * size / 2**30
    out: dict = {}
    if fp8_thinker:
        from omniduplex.kernels.fp8_linear import fp8_weight_bytes
        from omniduplex.models.registry import build_modules

        with torch.device("meta"):
            lm = build_modules(real_config(name))["thinker."].model
        b = fp8_weight_bytes(lm)
        weights -= (b["bf16_all"] - b["float"]) / 2 * size / 2**30 - b["fp8"] / 2**30
        out["fp8_thinker_gib"] = b["fp8"] / 2**30
    cfg = real_config(name)
    cfg = (
        cfg[0]["talker_config"]
        if isinstance(cfg, tuple)
        else cfg.get("thinker_config", {}).get("text_config", cfg)
    )
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    return {"weights": weights, "kv": per_token * kv_tokens / 2**30, "kv_bytes_per_token": per_token, **out}
