"""FP8 (e4m3) weights for a GPU decoder, with a CPU twin: per-output-channel scales, the matmul through
``torch._scaled_mm`` on a CUDA GPU that has FP8 tensor cores (compute capability ≥ 8.9: L4, H100, H200),
dequantised and multiplied in the activations' dtype elsewhere (the CPU twin: slow, for tests).

Scheme (the "FP8 dynamic, per channel" scheme vLLM serves Qwen3 FP8 checkpoints with): for each output row
``n`` of ``W [out, in]`` (each expert's row for MoE weights ``[E, out, in]``), ``scale[n] = max_k |W[n, k]|
/ 448`` (448: the largest finite e4m3 value, OCP FP8 spec / ``torch.finfo(torch.float8_e4m3fn).max``) and
``Wq = (W / scale[n]).to(float8_e4m3fn)``: 3 mantissa bits, a relative rounding error ≤ 2^-4 per weight.
On CUDA the activations are quantized the same way per token (row) right before the product, and
``_scaled_mm`` multiplies the two e4m3 operands with fp32 accumulation, scaling rows and columns
(``scale_a`` ``[T, 1]``, ``scale_b`` ``[1, N]``) into a bf16 result.

Memory: one byte per weight plus four per output row, against two for bf16: the Qwen3-Omni-30B-A3B Thinker's
LM weights halve (:func:`fp8_weight_bytes`, printed by ``omniduplex init-model --preset real``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(FP8).max)  # 448.0


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` float ``[..., out, in]`` → (``Wq`` e4m3 of the same shape, ``scale`` fp32 ``[..., out]``),
    per output channel (module doc); an all-zero row gets scale 1.

    Raises:
        ValueError: fewer than 2 dims, not floating point, or inf/NaN in ``weight``.
    """
    if weight.dim() < 2 or not weight.is_floating_point():
        raise ValueError(f"expected a float weight [..., out, in], got {tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("weight holds inf or NaN: cannot quantize it to fp8")
    amax = w.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (w / scale[..., None]).to(FP8), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q`` e4m3 ``[..., out, in]`` × ``scale`` ``[..., out]`` → ``dtype`` weights of ``q``'s shape."""
    return (q.float() * scale[..., None]).to(dtype)


def scaled_mm_ok(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` runs e4m3 on ``device``: a CUDA GPU of compute capability ≥ 8.9."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, in]`` @ (``q`` e4m3 ``[out, in]`` × ``scale`` fp32 ``[out]``)ᵀ → ``[T, out]`` in x.dtype.
    ``_scaled_mm`` (activations per token to e4m3) where :func:`scaled_mm_ok` and ``in``/``out`` are
    multiples of 16 (its alignment rule); else the CPU twin (dequantise, ``F.linear``)."""
    if scaled_mm_ok(x.device) and q.shape[0] % 16 == 0 and q.shape[1] % 16 == 0:
        xf = x.float()
        sx = (xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp_min(1e-12)  # [T, 1]
        xq = (xf / sx).to(FP8)
        y = torch._scaled_mm(xq, q.t(), scale_a=sx, scale_b=scale[None, :], out_dtype=torch.bfloat16)
        return y.to(x.dtype)
    return F.linear(x, dequantize_fp8(q, scale, x.dtype))


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` with e4m3 weights (:func:`fp8_matmul`). ``weight`` is an empty tensor of the replaced
    weight's dtype and device (callers read ``.weight.dtype``/``.device``); ``qweight`` e4m3 ``[out, in]``
    and ``scale`` fp32 ``[out]`` are buffers. Forward: ``[..., in]`` → ``[..., out]`` in the input's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_fp8(linear.weight)
        self.register_buffer("qweight", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("weight", linear.weight.new_empty(0), persistent=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = fp8_matmul(x.reshape(-1, self.in_features), self.qweight, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def _fp8_experts_forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """:class:`~omniduplex.models.moe_experts.Experts` forward on e4m3 experts: each expert hit runs its
    rows (gate_up, SiLU·up, down) through :func:`fp8_matmul`; ``[T, H]`` weighted sum of the top-k outputs.
    Reads the expert ids on the host (eager only, no graph capture)."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("e4m3 MoE experts read their expert ids on the host: run them eager (graphs off)")
    out = torch.zeros_like(x, dtype=torch.float32)
    flat = ids.reshape(-1)
    for e in flat.unique().tolist():
        pos = (flat == e).nonzero().squeeze(1)
        tok = pos // ids.shape[1]
        gate, up = fp8_matmul(x[tok], self.gate_up_q[e], self.gate_up_scale[e]).chunk(2, dim=-1)
        h = fp8_matmul(F.silu(gate) * up, self.down_q[e], self.down_scale[e])
        out.index_add_(0, tok, h.float() * weights.reshape(-1)[pos, None].float())
    return out.to(x.dtype)


def _is_experts(mod: nn.Module) -> bool:
    """Whether ``mod`` holds fused MoE experts (:class:`omniduplex.models.moe_experts.Experts`: 3-D
    ``gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]`` parameters); duck-typed, as kernels do
    not import models."""
    gu, dn = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    if not (isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter)):
        return False
    return gu.dim() == 3 == dn.dim() and gu.numel() > 0  # empty: already converted


def quantize_fp8_(model: nn.Module, skip: tuple[str, ...] = ("lm_head", "embed_tokens")) -> int:
    """Put ``model``'s linear layers and MoE experts on e4m3 weights, in place (the float weights freed one
    by one, so the peak is the float model plus one weight); names ending in ``skip`` stay float. Returns
    the number of weights converted."""
    n = 0
    for name, mod in list(model.named_modules()):
        if name.endswith(skip):
            continue
        if isinstance(mod, nn.Linear):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, Fp8Linear(mod))
            n += 1
        elif _is_experts(mod):
            for part in ("gate_up", "down"):
                q, s = quantize_fp8(getattr(mod, f"{part}_proj"))
                setattr(mod, f"{part}_proj", nn.Parameter(q.new_empty(0, 0, 0), requires_grad=False))
                mod.register_buffer(f"{part}_q", q, persistent=False)
                mod.register_buffer(f"{part}_scale", s, persistent=False)
            mod.forward = _fp8_experts_forward.__get__(mod)
            mod.prepack = lambda: 0  # nothing for oneDNN to pack: the experts are e4m3
            n += 2
    return n


def fp8_weight_bytes(model: nn.Module, skip: tuple[str, ...] = ("lm_head", "embed_tokens")) -> dict[str, int]:
    """Bytes of ``model``'s weights with :func:`quantize_fp8_`'s conversion (works on the meta device):
    ``{"fp8": e4m3 bytes + fp32 scales, "float": the rest at 2 bytes (bf16), "bf16_all": all at bf16}``."""
    fp8 = rows = 0
    seen: set[int] = set()
    for name, mod in model.named_modules():
        if name.endswith(skip):
            continue
        if isinstance(mod, nn.Linear):
            ws = [mod.weight]
        elif _is_experts(mod):
            ws = [mod.gate_up_proj, mod.down_proj]
        else:
            continue
        for w in ws:
            seen.add(id(w))
            fp8 += w.numel()
            rows += w.numel() // w.shape[-1]
    total = sum(p.numel() for p in model.parameters())
    rest = sum(p.numel() for p in model.parameters() if id(p) not in seen)
    return {"fp8": fp8 + 4 * rows, "float": 2 * rest, "bf16_all": 2 * total}
