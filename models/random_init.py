"""Random weights built directly on the device: weightless model directories (``real`` presets).

A model directory holding :data:`MARKER` has a ``config.json`` and no weights; the loaders build its modules
under :func:`building_on` (parameters allocated on the device in the serving dtype, no fp32 copy on the host)
and fill them with :func:`random_init_`. A 30B model is ready in seconds on a GPU and needs no disk.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch

MARKER = "random_weights.json"
"""File whose presence makes a model directory weightless (JSON: ``{"seed": int}``)."""


def random_seed(model_dir: str | Path) -> int | None:
    """The seed of a weightless directory (``None``: the directory has weights, no :data:`MARKER`).

    Raises:
        ValueError: the marker is not a JSON object with an integer ``seed``.
    """
    path = Path(model_dir) / MARKER
    if not path.is_file():
        return None
    try:
        seed = json.loads(path.read_text()).get("seed", 0)
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a JSON object ({e})") from e
    if not isinstance(seed, int):
        raise ValueError(f"{path}: seed must be an integer, got {seed!r}")
    return seed


@contextlib.contextmanager
def building_on(device: str | torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules constructed inside allocate their parameters on ``device`` in ``dtype`` (the default device
    and floating dtype, restored on exit). Buffers that their modules compute in fp32 explicitly (RoPE
    ``inv_freq``) stay fp32."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


@torch.no_grad()
def random_init_(module: torch.nn.Module, seed: int = 0) -> int:
    """Fill every parameter of ``module`` in place, on its device; returns the number of values written.

    Rules (as :func:`~.qwen3_omni.presets.draw_tensor`): SnakeBeta ``alpha``/``beta`` (log-scale) 0, layer
    scales 0.01, biases 0, other 1-D tensors (norm weights) 1, matrices, embeddings and conv kernels
    N(0, 1 / fan_in) (LeCun; fan_in = the product of all but the first dimension, an MoE expert stack's
    last one; so activations stay O(1) through a deep random stack in bf16).
    Each tensor draws from its own generator seeded by ``(seed, index)``: deterministic per device.
    """
    n = 0
    for i, (name, p) in enumerate(module.named_parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("alpha", "beta") or leaf == "bias":
            p.zero_()
        elif leaf == "scale" or name.endswith("layer_scale.scale"):
            p.fill_(0.01)
        elif p.dim() == 1:
            p.fill_(1.0)
        else:
            g = torch.Generator(device=p.device).manual_seed(seed * 1_000_003 + i)
            experts = p.dim() == 3 and leaf in ("gate_up_proj", "down_proj")  # [E, out, in]
            fan_in = p.shape[-1] if experts else math.prod(p.shape[1:])
            p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=g)
        n += p.numel()
    return n
