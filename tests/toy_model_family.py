"""A toy model family registered from outside the package (a ``--plugin`` module of
tests/test_model_families.py): ``ToyLMForCausalLM``, a small decoder with its own ``config.json`` keys
(``d_model``, ``n_layers``, ``n_heads``, ``vocab``), its tensors under ``toy.``, on the ``qwen3-omni``
graph shape at 16 kHz. Nothing in the package names it: :func:`register_model_family` is the one place."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from omniduplex.models.checkpoint import load_state_dict_into
from omniduplex.models.config import DecoderConfig
from omniduplex.models.decoder_lm import DecoderLM
from omniduplex.models.random_init import random_init_
from omniduplex.models.registry import LoadedModel, ModelFamily, build_modules, register_model_family

ARCHITECTURE = "ToyLMForCausalLM"
PRESETS = {"tiny": {"d_model": 32, "n_layers": 2, "n_heads": 4, "vocab": 96}}


def toy_config(raw: dict) -> DecoderConfig:
    """The toy's ``config.json`` keys → a decoder config (no q/k norm, GQA 2:1)."""
    return DecoderConfig.from_dict({
        "vocab_size": raw["vocab"], "hidden_size": raw["d_model"], "num_hidden_layers": raw["n_layers"],
        "num_attention_heads": raw["n_heads"], "num_key_value_heads": raw["n_heads"] // 2,
        "intermediate_size": 2 * raw["d_model"],
    }, qk_norm=False)


def build(raw: dict, arch: str) -> dict[str, nn.Module]:
    return {"toy.": DecoderLM(toy_config(raw))}


def load(raw: dict, arch: str, files, parts: tuple[str, ...], model_dir: Path) -> LoadedModel:
    lm = DecoderLM(toy_config(raw))
    load_state_dict_into(lm, files, prefix="toy.")
    return LoadedModel(arch, model_dir, raw, None, thinker=lm, parts=("thinker",))


def init(out: Path, preset: str, seed: int) -> None:
    """Write the ``preset`` (``tiny``) with seeded random weights: ``config.json`` + ``model.safetensors``."""
    if preset not in PRESETS:
        raise ValueError(f"toy-lm has no preset {preset!r}; choose from {list(PRESETS)}")
    raw = {"architectures": [ARCHITECTURE], **PRESETS[preset]}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw))
    tensors = {}
    for prefix, module in build_modules(raw).items():
        random_init_(module, seed)
        tensors |= {prefix + k: v.contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"))


TOY = register_model_family(
    ModelFamily("toy-lm", (ARCHITECTURE,), build, load, output_rate=lambda raw: 16000, init=init)
)
