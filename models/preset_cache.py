"""Random-weight preset checkpoints kept in the cache, so the checks that run several shapes (the GPU tests,
``scripts/device_shapes.py``) write each one once per machine (a ``small`` one takes 15-30 s to draw)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omniduplex.models.weights import cache_dir

ARCHS = ("qwen3-omni", "unified", "qwen3-tts")


def cached_checkpoint(arch: str, preset: str, seed: int = 0, variant: str = "custom_voice") -> Path:
    """The directory of the deterministic checkpoint ``omniduplex init-model --arch ARCH --preset PRESET
    --seed SEED [--variant VARIANT]`` writes, under :func:`~.weights.cache_dir` ``/presets``; written on
    first use (to a temporary name, then renamed, so concurrent writers agree).

    ``variant`` applies to ``qwen3-tts`` only.

    Raises:
        ValueError: unknown ``arch`` or ``preset``.
    """
    from omniduplex.models.qwen3_omni.presets import write_checkpoint
    from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
    from omniduplex.models.unified.presets import write_unified_checkpoint

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {list(ARCHS)}")
    name = f"{arch}-{preset}-{seed}" + (f"-{variant}" if arch == "qwen3-tts" else "")
    d = cache_dir() / "presets" / name
    if (d / "model.safetensors").is_file():
        return d
    tmp = d.with_name(f"{name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if arch == "qwen3-omni":
        write_checkpoint(tmp, preset, seed)
    elif arch == "unified":
        write_unified_checkpoint(tmp, preset, seed)
    else:
        write_tts_checkpoint(tmp, preset, seed, variant)
    try:
        tmp.rename(d)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return d
