"""Fused Triton element-wise kernels of a CUDA decode step: the glue between a layer's GEMMs in one kernel
each instead of ~5-30 ATen kernels (vLLM's CUDA ops fuse the same: ``rms_norm``, ``fused_add_rms_norm``,
``rotary_embedding``, ``silu_and_mul``).

- :func:`rms_norm` ``(x [..., H], w [H], eps) -> [..., H]``: RMSNorm (Zhang & Sennrich 2019).
- :func:`add_rms_norm` ``(x, delta, w, eps) -> (x + delta, rms_norm(x + delta))``: the residual add fused.
- :func:`rotary_` ``(q [T, Hq, D], k [T, Hkv, D], cos, sin fp32 [T, D], q_weight, k_weight, eps)``: optional
  per-head RMSNorm (Qwen3's ``q_norm`` / ``k_norm``) then rotate-half RoPE (Su et al. 2021), in place, q and
  k of a token in one program.
- :func:`silu_and_mul` ``(x [T, 2I]) -> [T, I]``: ``silu(gate) * up`` of a merged gate/up projection
  (SwiGLU, Shazeer 2020).

Each computes what :mod:`omniduplex.models.layers` computes, in its order and with its roundings (fp32
statistics; the normed value rounded to the input dtype before the weight multiply; RoPE's two products
rounded to the dtype before their sum; SiLU rounded before the multiply), so bf16 results match the torch
path to within one rounding (sums of squares in another order, ``exp`` of another library) and fp32
results to a few ulp. Inputs are read once and outputs written once in the input dtype: no dtype-cast round
trip through memory. No host sync and no data-dependent allocation: capturable in a CUDA graph.

:func:`attach` switches a model's layers onto these kernels (flag ``use_triton_ops``) when the model is on
CUDA; ``OMNIDUPLEX_TRITON_OPS=0`` keeps the torch path (e.g. to compare). Like
:mod:`.paged_decode_attention`, triton is imported on first use, never at import; tests run the kernels on
CPU tensors under ``TRITON_INTERPRET=1`` (set before triton is first imported).
"""

from __future__ import annotations

import os

import torch

from omniduplex.kernels.paged_decode_attention import HAS_TRITON
from omniduplex.kernels.paged_decode_config import next_pow2

__all__ = ["ENV", "add_rms_norm", "attach", "enabled", "rms_norm", "rotary_", "silu_and_mul"]

ENV = "OMNIDUPLEX_TRITON_OPS"
"""``0`` keeps the plain-torch element-wise code on CUDA (:func:`attach` turns nothing on)."""

triton = None  # bound on first use (see module docstring)
tl = None


def _rms_norm_kernel(
    x_ptr,  # [R, H]
    delta_ptr,  # [R, H] or unused
    res_ptr,  # [R, H] x + delta, or unused
    w_ptr,  # [H]
    y_ptr,  # [R, H]
    stride_x,
    stride_d,
    stride_r,
    stride_y,
    eps,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ADD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < H
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if ADD:  # residual in the input dtype, as ``x + delta`` rounds
        x = (x.to(tl.float32) + tl.load(delta_ptr + row * stride_d + offs, mask=mask, other=0.0)).to(x.dtype)
        tl.store(res_ptr + row * stride_r + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / H + eps)
    normed = (xf * rstd).to(x.dtype)  # torch: (x.float() * rsqrt(...)).to(dtype), then weight * that
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _rotary_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [T, Hkv, D]
    cos_ptr,  # fp32 [T, D]
    sin_ptr,
    qw_ptr,  # [D] per-head norm weights, or unused
    kw_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ct,
    stride_st,
    num_q_heads,
    num_k_heads,
    eps,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    NORM: tl.constexpr,
):
    """One token: its q heads then its k heads as rows ``0 .. Hq + Hkv - 1`` of one tile."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_HEADS)
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < HALF
    is_q = h < num_q_heads
    is_k = (h >= num_q_heads) & (h < num_q_heads + num_k_heads)
    mq = is_q[:, None] & d_mask[None, :]
    mk = is_k[:, None] & d_mask[None, :]
    q_off = t * stride_qt + h[:, None] * stride_qh + d[None, :]
    k_off = t * stride_kt + (h - num_q_heads)[:, None] * stride_kh + d[None, :]
    x1 = tl.where(mq, tl.load(q_ptr + q_off, mask=mq, other=0.0), tl.load(k_ptr + k_off, mask=mk, other=0.0))
    x2 = tl.where(
        mq,
        tl.load(q_ptr + q_off + HALF, mask=mq, other=0.0),
        tl.load(k_ptr + k_off + HALF, mask=mk, other=0.0),
    )
    dtype = x1.dtype
    if NORM:  # Qwen3 q_norm / k_norm over the head: weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(f1 * f1, 1) + tl.sum(f2 * f2, 1)) / (2 * HALF) + eps)
        qw1 = tl.load(qw_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
        qw2 = tl.load(qw_ptr + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
        kw1 = tl.load(kw_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
        kw2 = tl.load(kw_ptr + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
        w1 = tl.where(is_q[:, None], qw1[None, :], kw1[None, :])
        w2 = tl.where(is_q[:, None], qw2[None, :], kw2[None, :])
        x1 = (w1 * (f1 * rstd[:, None]).to(dtype).to(tl.float32)).to(dtype)
        x2 = (w2 * (f2 * rstd[:, None]).to(dtype).to(tl.float32)).to(dtype)
    # torch: cos/sin cast to the dtype, x * cos + rotate_half(x) * sin with each product rounded
    c1 = tl.load(cos_ptr + t * stride_ct + d, mask=d_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d, mask=d_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * stride_st + d, mask=d_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * stride_st + HALF + d, mask=d_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    o1 = ((f1 * c1).to(dtype).to(tl.float32) + (-f2 * s1).to(dtype).to(tl.float32)).to(dtype)
    o2 = ((f2 * c2).to(dtype).to(tl.float32) + (f1 * s2).to(dtype).to(tl.float32)).to(dtype)
    tl.store(q_ptr + q_off, o1, mask=mq)
    tl.store(q_ptr + q_off + HALF, o2, mask=mq)
    tl.store(k_ptr + k_off, o1, mask=mk)
    tl.store(k_ptr + k_off + HALF, o2, mask=mk)


def _silu_mul_kernel(
    x_ptr,  # [T, 2I]: gate | up
    y_ptr,  # [T, I]
    stride_x,
    stride_y,
    inter,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds to the dtype before the multiply
    y = act.to(tl.float32) * up.to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


_compiled: dict[str, object] = {}


def _kernels() -> dict[str, object]:
    """Import triton and jit the kernels on first use.

    Raises:
        RuntimeError: triton is missing, or ``TRITON_INTERPRET=1`` was set after triton was imported.
    """
    global triton, tl
    if not HAS_TRITON:
        raise RuntimeError("omniduplex.kernels.triton_ops needs the `triton` package (pip install triton)")
    if not _compiled:
        import triton as triton_module
        import triton.language as tl_module

        if (
            os.environ.get("TRITON_INTERPRET") == "1"
            and type(tl_module.sum).__name__ != "InterpretedFunction"
        ):
            raise RuntimeError("TRITON_INTERPRET=1 was set after triton had been imported; set it first")
        triton, tl = triton_module, tl_module
        _compiled["rms"] = triton.jit(_rms_norm_kernel)
        _compiled["rope"] = triton.jit(_rotary_kernel)
        _compiled["silu"] = triton.jit(_silu_mul_kernel)
    return _compiled


def _warps(elements: int) -> int:
    """Warps for a one-row tile of ``elements`` values: ~8 values per thread, 1 to 16 warps."""
    return max(1, min(16, elements // 256))


def _rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` as a 2-D ``[rows, H]`` view (a copy only if it cannot be viewed so) with a unit last stride."""
    if x.dim() == 0 or x.stride(-1) != 1:
        raise ValueError(f"{name} needs a contiguous last dimension, got strides {x.stride()}")
    return x.reshape(-1, x.shape[-1])


def _norm(x, delta, weight, eps) -> tuple[torch.Tensor, torch.Tensor | None]:
    kernels = _kernels()
    h = x.shape[-1]
    if weight.shape != (h,) or weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(
            f"weight {tuple(weight.shape)} {weight.dtype} does not fit x {tuple(x.shape)} {x.dtype}"
        )
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"unsupported dtype {x.dtype}")
    rows = _rows(x, "x")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, h)
    if delta is not None:
        if delta.shape != x.shape or delta.dtype != x.dtype:
            raise ValueError(
                f"delta {tuple(delta.shape)} {delta.dtype} differs from x {tuple(x.shape)} {x.dtype}"
            )
        d2 = _rows(delta, "delta")
        res = torch.empty_like(y)
        r2 = res.view(-1, h)
    else:
        d2 = r2 = res = None
    if rows.shape[0]:
        block = max(16, next_pow2(h))
        kernels["rms"][(rows.shape[0],)](
            rows,
            rows if d2 is None else d2,
            y2 if r2 is None else r2,
            weight,
            y2,
            rows.stride(0),
            0 if d2 is None else d2.stride(0),
            0 if r2 is None else r2.stride(0),
            y2.stride(0),
            float(eps),
            H=h,
            BLOCK_H=block,
            ADD=delta is not None,
            num_warps=_warps(block),
        )
    return y, res


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)``, statistics in fp32.

    Args:
        x: ``[..., H]`` fp32/bf16/fp16, last dim contiguous (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        weight: ``[H]`` in the dtype of ``x``.
        eps: added to the mean square.

    Returns:
        A new contiguous tensor shaped and typed like ``x``.

    Raises:
        ValueError: mismatched weight, unsupported dtype or a strided last dimension.
        RuntimeError: triton is not installed.
    """
    return _norm(x, None, weight, eps)[0]


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, rms_norm(x + delta))`` in one pass: the residual add of a pre-norm block and the next
    norm. ``delta`` shaped and typed like ``x``; the sum is rounded to the dtype before the norm, as the
    torch code's ``x = x + delta`` is. Returns two new contiguous tensors. Raises as :func:`rms_norm`."""
    y, res = _norm(x, delta, weight, eps)
    return res, y


def rotary_(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    """Rotate-half RoPE of ``q`` and ``k`` in place, after a per-head RMSNorm when weights are given (Qwen3's
    ``q_norm``/``k_norm``), as :func:`omniduplex.models.layers.apply_rotary` after ``RMSNorm`` computes it.

    Args:
        q: ``[T, Hq, D]``, k: ``[T, Hkv, D]``: one dtype (fp32/bf16/fp16), ``D`` even, last dim contiguous
            (views of a fused qkv projection are fine).
        cos, sin: fp32 ``[T, D]`` (from :class:`omniduplex.models.layers.RotaryEmbedding` of the positions).
        q_weight, k_weight: ``[D]`` in the dtype of ``q``, both or neither.
        eps: the norms' epsilon.

    Raises:
        ValueError: on mismatched shapes, dtypes or strides.
        RuntimeError: triton is not installed.
    """
    kernels = _kernels()
    t, hq, dim = q.shape
    if k.dim() != 3 or k.shape[0] != t or k.shape[2] != dim or dim % 2 or k.dtype != q.dtype:
        raise ValueError(f"q {tuple(q.shape)} {q.dtype} and k {tuple(k.shape)} {k.dtype} do not fit")
    if cos.shape != (t, dim) or sin.shape != (t, dim) or cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError(f"cos/sin must be [{t}, {dim}] with a contiguous last dim")
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("q and k need a contiguous last dimension")
    norm = q_weight is not None
    if norm != (k_weight is not None) or (norm and (q_weight.shape != (dim,) or k_weight.shape != (dim,))):
        raise ValueError("q_weight and k_weight: both [head_dim] or neither")
    if t == 0:
        return
    half, heads = dim // 2, max(2, next_pow2(hq + k.shape[1]))
    block_half = max(2, next_pow2(half))
    kernels["rope"][(t,)](
        q,
        k,
        cos,
        sin,
        q_weight if norm else cos,
        k_weight if norm else cos,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        hq,
        k.shape[1],
        float(eps),
        HALF=half,
        BLOCK_HALF=block_half,
        BLOCK_HEADS=heads,
        NORM=norm,
        num_warps=_warps(heads * block_half // 2),
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` of ``x = [gate | up]`` ``[..., 2I]`` (last dim contiguous) -> new ``[..., I]`` in
    the dtype of ``x``; SiLU in fp32, rounded to the dtype before the multiply as ``F.silu`` does.

    Raises:
        ValueError: odd or strided last dimension. RuntimeError: triton is not installed.
    """
    kernels = _kernels()
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"x must be [..., 2I], got {tuple(x.shape)}")
    rows = _rows(x, "x")
    inter = x.shape[-1] // 2
    y = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if rows.shape[0] and inter:
        block = min(1024, max(16, next_pow2(inter)))
        grid = (rows.shape[0], -(-inter // block))
        kernels["silu"][grid](rows, y, rows.stride(0), inter, inter, BLOCK=block, num_warps=_warps(block))
    return y


def enabled() -> bool:
    """``False`` when ``OMNIDUPLEX_TRITON_OPS=0``."""
    return os.environ.get(ENV, "1").strip() != "0"


def attach(model: torch.nn.Module, enable: bool | None = None) -> bool:
    """Switch RMSNorm, the residual add + norm, q/k norm + RoPE and SiLU-up of ``model``'s layers (modules
    with a ``use_triton_ops`` attribute) onto these kernels; returns whether it did.

    Args:
        enable: ``None``: on when ``model``'s parameters are on CUDA, triton is installed and :func:`enabled`;
            ``True`` forces it on (tests: CPU tensors under ``TRITON_INTERPRET=1``); ``False`` turns it off.

    Raises:
        RuntimeError: ``enable=True`` without triton.
    """
    if enable is None:
        params = next(model.parameters(), None)
        enable = params is not None and params.device.type == "cuda" and HAS_TRITON and enabled()
    elif enable and not HAS_TRITON:
        raise RuntimeError("triton_ops.attach(enable=True) needs the `triton` package")
    for mod in model.modules():
        if hasattr(mod, "use_triton_ops"):
            mod.use_triton_ops = enable
    return enable
