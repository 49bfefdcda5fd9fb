"""Payload layout: how the named tensors of one message map onto one logical byte range.

A message's tensors are laid out back to back in a logical *payload* (each tensor starting at a
multiple of ``align`` bytes). The payload is then cut into slot-sized windows: window ``k`` lives in
the ``k``-th slot of the message, whatever the physical slot index. Producer and consumer walk the
same :func:`pieces` of the payload, so neither needs per-piece offsets on the wire.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

#: Wire code of each supported dtype is its index in this tuple (append only: the codes are protocol).
DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
    torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64,
)
DTYPE_CODE: dict[torch.dtype, int] = {dt: i for i, dt in enumerate(DTYPES)}

#: Tensor alignment (bytes) in slot-borne payloads and in inline payloads (protocol constants).
SLOT_ALIGN = 64
INLINE_ALIGN = 8

MAX_DIM = 2**32 - 1
MAX_NDIM = 255
MAX_TENSORS = 255
MAX_NAME_BYTES = 255


@dataclass(slots=True)
class TensorSpec:
    """Name, dtype and shape of one tensor of a message."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(slots=True)
class Layout:
    """Where each tensor of a message sits in the logical payload (byte offsets, total in bytes)."""

    specs: tuple[TensorSpec, ...]
    offsets: tuple[int, ...]
    total: int


@dataclass(slots=True)
class Piece:
    """One contiguous run of bytes belonging to one tensor and one slot.

    ``src`` is the byte offset inside the tensor, ``window`` the index of the slot within the
    fragment (0 = first slot of the fragment), ``dst`` the byte offset inside that slot.
    """

    tensor: int
    src: int
    window: int
    dst: int
    nbytes: int


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def plan(specs: tuple[TensorSpec, ...], align: int) -> Layout:
    """Lay ``specs`` out back to back, each starting at a multiple of ``align`` bytes."""
    if len(specs) == 1:
        return Layout(specs, (0,), specs[0].nbytes)
    offsets = []
    pos = 0
    for spec in specs:
        pos = _round_up(pos, align)
        offsets.append(pos)
        pos += spec.nbytes
    return Layout(specs, tuple(offsets), pos)


def pieces(layout: Layout, start: int, stop: int, slot_bytes: int) -> list[Piece]:
    """The pieces of payload bytes ``[start, stop)``, in payload order.

    ``start`` is where the fragment's first slot begins (a multiple of ``slot_bytes``); slot
    ``window`` of the fragment holds payload bytes ``[start + window*slot_bytes, ... + slot_bytes)``.
    """
    if len(layout.specs) == 1 and stop - start <= slot_bytes and start == 0:  # the common case
        return [Piece(0, 0, 0, 0, stop)] if stop else []
    out = []
    for i, (spec, off) in enumerate(zip(layout.specs, layout.offsets, strict=True)):
        lo, hi = max(off, start), min(off + spec.nbytes, stop)
        while lo < hi:
            window, dst = divmod(lo - start, slot_bytes)
            n = min(hi - lo, slot_bytes - dst)
            out.append(Piece(i, lo - off, window, dst, n))
            lo += n
    return out


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    """Validated spec of ``tensor``; raises ``TypeError``/``ValueError`` for what the wire can't carry."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, got {type(name).__name__}")
    if len(name) > MAX_NAME_BYTES // 4 and len(name.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"tensor name {name[:32]!r}... is longer than {MAX_NAME_BYTES} bytes")
    if tensor.dtype not in DTYPE_CODE:
        raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} is not supported by the relay")
    if tensor.layout is not torch.strided:
        raise ValueError(f"tensor {name!r}: only strided (dense) tensors are supported")
    shape = tuple(tensor.shape)
    if len(shape) > MAX_NDIM or (shape and max(shape) > MAX_DIM):
        raise ValueError(f"tensor {name!r}: shape {shape} exceeds the wire limits")
    return TensorSpec(name, tensor.dtype, shape)


#: Flat ``uint8`` bytes of a tensor: a numpy array for CPU tensors (cheap to slice and copy), a torch
#: tensor on other devices.
Bytes = np.ndarray | torch.Tensor


def prepare(tensors: Mapping[str, torch.Tensor]) -> tuple[tuple[TensorSpec, ...], list[Bytes]]:
    """Specs of ``tensors`` and the flat bytes of each (views: no copy unless not contiguous)."""
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"a message carries at most {MAX_TENSORS} tensors, got {len(tensors)}")
    specs = []
    flats = []
    for name, t in tensors.items():
        specs.append(spec_of(name, t))
        flat = byte_view(t)
        flats.append(flat.numpy() if flat.device.type == "cpu" else flat)
    return tuple(specs), flats


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """Flat ``uint8`` view of ``t``'s bytes (a copy only when ``t`` is not contiguous)."""
    if t.requires_grad:
        t = t.detach()
    if t.numel() == 0:  # an empty tensor may carry stride 0 (from numpy), which no view accepts
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dim() != 1:
        t = t.view(-1)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def allocate(specs: tuple[TensorSpec, ...], device: torch.device) -> tuple[dict[str, torch.Tensor],
                                                                          list[Bytes]]:
    """Fresh, uninitialised tensors for ``specs`` on ``device``, and the flat bytes of each.

    CPU tensors are allocated by numpy, which asks for transparent huge pages for large arrays:
    filling fresh memory is bound by page faults, and a 64 MiB copy runs ~2.5x faster into huge
    pages than into ``torch.empty``'s 4 KiB pages.
    """
    out = {}
    flats: list[Bytes] = []
    cpu = device.type == "cpu"
    for spec in specs:
        if cpu and spec.nbytes == 0:
            t = torch.empty(spec.shape, dtype=spec.dtype)
            flats.append(np.empty(0, dtype=np.uint8))
        elif cpu:
            raw = np.empty(spec.nbytes, dtype=np.uint8)
            t = torch.from_numpy(raw)
            if spec.dtype != torch.uint8:
                t = t.view(spec.dtype)
            t = t.view(spec.shape)
            flats.append(raw)
        else:
            t = torch.empty(spec.shape, dtype=spec.dtype, device=device)
            flats.append(byte_view(t))
        out[spec.name] = t
    return out, flats


def _host(flat: Bytes) -> np.ndarray:
    return flat if isinstance(flat, np.ndarray) else flat.cpu().numpy()


def pack_inline(layout: Layout, flats: list[Bytes]) -> bytes:
    """The whole payload as ``bytes`` (for inline messages; ``layout`` from ``INLINE_ALIGN``)."""
    if len(flats) == 1:
        return _host(flats[0]).tobytes()
    buf = bytearray(layout.total)
    dst = np.frombuffer(buf, dtype=np.uint8)
    for off, flat in zip(layout.offsets, flats, strict=True):
        np.copyto(dst[off:off + flat.shape[0]], _host(flat))
    return bytes(buf)


def unpack_inline(layout: Layout, payload: bytes) -> dict[str, torch.Tensor]:
    """Fresh CPU tensors holding an inline ``payload`` (one copy: ``payload`` → each tensor's memory)."""
    if len(payload) != layout.total:
        raise ValueError(f"inline payload of {len(payload)} B, expected {layout.total} B")
    out = {}
    for spec, off in zip(layout.specs, layout.offsets, strict=True):
        n = spec.nbytes
        if n == 0:
            out[spec.name] = torch.empty(spec.shape, dtype=spec.dtype)
        else:
            t = torch.frombuffer(bytearray(payload[off:off + n]), dtype=spec.dtype)
            out[spec.name] = t.view(spec.shape) if len(spec.shape) != 1 else t
    return out
