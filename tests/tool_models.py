"""The packaged LLMs the tool tests run on, imported once into the shared cache (as ``omniduplex respond``
does): SmolLM2-135M-Instruct (always installed) and Qwen2.5-Coder-0.5B-Instruct (its six part wheels)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

TOOLS_YAML = Path(__file__).resolve().parents[1] / "benchmarks" / "tools.yaml"


def bench_tools() -> list[dict]:
    """The six function tools of ``benchmarks/tools.yaml``."""
    return yaml.safe_load(TOOLS_YAML.read_text())["tools"]


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct's imported checkpoint folder (skips when the weight package is missing)."""
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.weights import SMOLLM2_135M, WeightsError, cache_dir, locate

    try:
        src = locate(SMOLLM2_135M)
    except WeightsError as e:
        pytest.skip(str(e))
    return cached_import(src, cache_dir() / "gguf")


def qwen05_dir() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct's imported checkpoint folder (skips when its parts are missing)."""
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.weights import QWEN25_CODER_05B, WeightsError, assemble, cache_dir

    try:
        src = assemble(QWEN25_CODER_05B)
    except WeightsError as e:
        pytest.skip(str(e))
    return cached_import(src, cache_dir() / "gguf")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for the module: small models gain little from a second one, and two threads crawl
    on a busy 2-core host."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
