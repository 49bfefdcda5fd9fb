"""CUDA IPC data plane: the slot pool is one device buffer shared through a CUDA IPC handle.

Same protocol as the shared-memory plane; only where the slots live changes. The producer allocates
``slots * slot_bytes`` bytes on its current device once, and sends the buffer's IPC handle (pickled
by torch's own reductions) in the ``Welcome``. Each fragment is a device-to-device copy into the
slot, a stream sync, then the signal; the consumer copies the slot into a fresh device tensor,
syncs, then returns the credit. Behind :func:`cuda_ipc_available`; not testable on CPU-only hosts.
"""

from __future__ import annotations

import io
import pickle
import sys

import numpy as np
import torch


def cuda_ipc_available() -> tuple[bool, str]:
    """Whether CUDA IPC can be used here, and why not if it can't."""
    if not sys.platform.startswith("linux"):
        return False, "CUDA IPC needs Linux"
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    return True, ""


def _require() -> None:
    ok, why = cuda_ipc_available()
    if not ok:
        from omniduplex.relay.errors import RelayError

        raise RelayError(f"CUDA IPC data plane unavailable: {why}")


class CudaWriter:
    """Producer side: owns the device slot buffer."""

    kind = "cuda"

    def __init__(self, slots: int, slot_bytes: int) -> None:
        _require()
        from torch.multiprocessing.reductions import ForkingPickler

        self.slot_bytes = slot_bytes
        self.pool = torch.empty(slots * slot_bytes, dtype=torch.uint8, device="cuda")
        buf = io.BytesIO()
        ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(self.pool)
        self.descriptor = buf.getvalue()

    def put(self, slot: int, offset: int, src: np.ndarray | torch.Tensor) -> None:
        """Copy ``src`` (flat bytes: numpy for host memory, or a CUDA tensor) into ``slot`` at ``offset``."""
        if isinstance(src, np.ndarray):
            src = torch.from_numpy(src)
        start = slot * self.slot_bytes + offset
        self.pool[start:start + src.numel()].copy_(src, non_blocking=True)

    def take_frames(self) -> list:
        """Make the copies visible to the consumer before signalling; no extra frames."""
        torch.cuda.current_stream().synchronize()
        return []

    def release(self, timeout_s: float) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """Drop the device buffer (torch frees it once the consumer has unmapped it)."""
        self.pool = None


class CudaReader:
    """Consumer side: maps the producer's device buffer once and copies slots into fresh tensors."""

    def __init__(self, descriptor: bytes, slots: int, slot_bytes: int) -> None:
        _require()
        import torch.multiprocessing  # noqa: F401  (registers the CUDA tensor reductions)

        self.slot_bytes = slot_bytes
        self.pool = pickle.loads(descriptor)
        self.device = self.pool.device

    def begin(self, frames: list) -> None:
        """Start reading a fragment (no extra frames)."""

    def get(self, slot: int, offset: int, dst: torch.Tensor) -> None:
        """Copy bytes ``[offset, offset+len(dst))`` of ``slot`` into ``dst`` (flat ``uint8``, on device)."""
        start = slot * self.slot_bytes + offset
        dst.copy_(self.pool[start:start + dst.numel()], non_blocking=True)

    def finish(self) -> None:
        """Wait for the copies before the credit goes back."""
        torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        """Unmap the producer's buffer."""
        self.pool = None
