"""int8 weight-only linear layers for CPU decode: per-output-channel symmetric int8 weights + scales,
computed at load from the checkpoint's float weights, multiplied by a torch CPU kernel.

Quantization (the "int8 weight-only" scheme of LLM.int8()'s absmax baseline, Dettmers et al. 2022, and of
torchao's ``int8_weight_only``): for each output row ``n`` of ``W [out, in]``,
``scale[n] = max_k |W[n, k]| / 127`` and ``Wq[n, k] = round(W[n, k] / scale[n])`` in ``[-127, 127]``, so
``W ≈ Wq * scale[:, None]`` with an error of at most ``scale[n] / 2`` per weight. A decode step reads one
byte per weight instead of two (bf16) or four (fp32): on a CPU whose decode is memory-bound, fewer bytes
are a faster step.

The kernel: ``torch._weight_int8pack_mm(x bf16, Wq, scale bf16)``, aten's weight-only int8 matmul (the
one torchao's ``int8_weight_only`` calls; AVX512 code for bf16 activations, a vectorised AVX2 loop
elsewhere); activations stay in bf16, accumulation is fp32. fbgemm's ``quantized::linear_dynamic`` is faster
still (``omniduplex bench quant-linear``), but it quantizes the activations per tensor to 8 bits, and
Qwen2.5's activation outliers then move the logits by ~1 on average (argmax changed at 20% of positions of
the 0.5B, against 2% here), so it is measured, not served.

Which weights an LLM runs with ``llm_weights: auto`` follows what the CPU reports (:func:`choose_weights`:
bf16 where it multiplies bf16 natively, AMX or AVX512-BF16; int8 on AVX2); ``omniduplex bench
quant-linear`` and ``bench llm --gguf`` give the figures (MODELS.md, "int8 and bf16 weights").
"""

from __future__ import annotations

import torch
from torch import nn

WEIGHTS = ("int8", "bf16", "auto")
"""Values of the cascade manifest's ``llm_weights``: int8 (:func:`quantize_linears`), bf16 (the checkpoint's
weights in bf16, prepacked for oneDNN), or auto (:func:`choose_weights`; ``float`` there: the stage dtype)."""


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` float ``[out, in]`` → (``Wq`` int8 ``[out, in]``, ``scale`` fp32 ``[out]``), symmetric per
    output channel (module doc); an all-zero row gets scale 1 (its int8 row is zeros).

    Raises:
        ValueError: ``weight`` is not a 2-D floating tensor, or holds inf/NaN.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"expected a 2-D float weight [out, in], got {tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("weight holds inf or NaN: cannot quantize it to int8")
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU feature flags of ``/proc/cpuinfo`` (or of the text ``cpuinfo``); empty where unreadable."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def choose_weights(capability: str | None = None, flags: frozenset[str] | None = None) -> str:
    """``llm_weights: auto`` resolved for a CPU, by what it reports:

    - ``bf16`` where the CPU multiplies bf16 natively (``amx_bf16`` or ``avx512_bf16`` in ``flags``): oneDNN's
      AMX / AVX512-BF16 GEMMs on prepacked bf16 weights. Measured on a 2-core AVX512-BF16 EPYC (``bench llm
      --gguf``, Qwen2.5-Coder-0.5B): bf16 decodes 1.4x faster than int8 at c = 8 and 2x at c = 32, int8
      1.2x faster at c = 1;
    - ``int8`` where torch runs vectorised code but bf16 would be emulated (``capability`` ``AVX2`` or
      ``AVX512``): the weights at 1 byte instead of fp32's 4 (``bench quant-linear`` on the AVX2 dispatch:
      int8 2-3x fp32 at 1 row, 1.5-2x at 8);
    - ``float`` elsewhere (the stage's own dtype: aten's scalar int8 loop would not pay).

    Args:
        capability: ``torch.backends.cpu.get_cpu_capability()`` (``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``…);
            default: this process's.
        flags: ``/proc/cpuinfo`` flags (:func:`cpu_flags`); default: this machine's.
    """
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    flags = cpu_flags() if flags is None else flags
    if {"amx_bf16", "avx512_bf16"} & flags:
        return "bf16"
    if capability.upper().startswith(("AVX512", "AVX2")):
        return "int8"
    return "float"


class Int8Linear(nn.Module):
    """``y = x @ (Wq * scale).T + b`` on aten's weight-only int8 kernel (module doc).

    Args:
        linear: the float ``nn.Linear`` to replace (its weight is quantized here; the module keeps none of
            the float weight).

    Forward: ``x`` ``[..., in]`` of any float dtype → ``[..., out]`` in ``x``'s dtype. ``weight`` is an empty
    tensor of the replaced weight's dtype and device (callers read ``.weight.dtype``); ``qweight`` int8
    ``[out, in]`` and ``scale`` fp32 ``[out]`` are buffers (not saved in ``state_dict``).

    Raises:
        ValueError: a weight not on the CPU (the kernel is aten's CPU one), or not finite.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.weight.device.type != "cpu":
            raise ValueError(f"int8 weights run on the CPU; this weight is on {linear.weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_per_channel(linear.weight)
        self.register_buffer("qweight", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("scale_bf16", scale.bfloat16(), persistent=False)
        self.register_buffer("weight", torch.empty(0, dtype=linear.weight.dtype), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        y = torch._weight_int8pack_mm(rows.to(torch.bfloat16), self.qweight, self.scale_bf16)
        if self.bias is not None:
            y = y.float() + self.bias
        return y.to(x.dtype).view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an :class:`Int8Linear`, except those whose
    qualified name ends with a name in ``skip``; returns how many were replaced. A tied LM head gets its
    own int8 copy (the embedding keeps its float rows for the lookup). Call before
    :func:`~.cpu_linear.prepack_linears` (which then packs only what stayed float)."""
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if type(mod) is not Int8Linear and isinstance(mod, nn.Linear) and not name.endswith(skip)
    ]
    for name, mod in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear(mod))
    return len(targets)
