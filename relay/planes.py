"""The data-plane contract (where a fragment's bytes live) and the factories for its three kinds.

A writer copies (or, for frames, references) each piece of a fragment into slot ``slot`` at byte
``offset``; a reader copies the same pieces out in the same order. ``shm``: a shared-memory slot
pool (:mod:`.shm_pool`); ``frames``: ZMQ frames next to the control message (:mod:`.tcp`);
``cuda``: a device slot pool shared by CUDA IPC (:mod:`.cuda_ipc`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from omniduplex.relay.layout import Bytes
from omniduplex.relay.messages import Welcome


class PlaneWriter(Protocol):
    """Producer side of a data plane."""

    kind: str
    descriptor: bytes  # what the consumer needs to open the plane (e.g. the segment name)

    def put(self, slot: int, offset: int, src: Bytes) -> None:
        """Place ``src`` (flat bytes: numpy in host memory, torch on a GPU) at ``offset`` of ``slot``."""

    def take_frames(self) -> list:
        """Finish the fragment's writes; return the extra ZMQ frames to send with its ``DataReady``."""

    def release(self, timeout_s: float) -> None:
        """After sending: wait until the plane no longer needs the caller's tensors."""

    def close(self) -> None:
        """Free the plane (unlinks shared memory)."""


class PlaneReader(Protocol):
    """Consumer side of a data plane."""

    device: torch.device  # where received tensors are allocated

    def begin(self, frames: list) -> None:
        """Start reading one fragment (``frames``: the extra frames of its ``DataReady``)."""

    def get(self, slot: int, offset: int, dst: Bytes) -> None:
        """Copy ``len(dst)`` bytes at ``offset`` of ``slot`` into ``dst`` (from :func:`.layout.allocate`)."""

    def finish(self) -> None:
        """The fragment's slots may be reused once this returns."""

    def close(self) -> None:
        """Unmap the plane."""


def open_writer(kind: str, edge: str, slots: int, slot_bytes: int) -> PlaneWriter:
    """Create the producer side of plane ``kind`` for ``edge``."""
    if kind == "shm":
        from omniduplex.relay.shm_pool import ShmWriter

        return ShmWriter(edge, slots, slot_bytes)
    if kind == "frames":
        from omniduplex.relay.tcp import FrameWriter

        return FrameWriter()
    if kind == "cuda":
        from omniduplex.relay.cuda_ipc import CudaWriter

        return CudaWriter(slots, slot_bytes)
    raise ValueError(f"unknown data plane {kind!r}")


def open_reader(welcome: Welcome) -> PlaneReader:
    """Open the consumer side of the plane a ``Welcome`` announces."""
    if welcome.plane == "shm":
        from omniduplex.relay.shm_pool import ShmReader

        return ShmReader(welcome.descriptor, welcome.slots, welcome.slot_bytes)
    if welcome.plane == "frames":
        from omniduplex.relay.tcp import FrameReader

        return FrameReader()
    if welcome.plane == "cuda":
        from omniduplex.relay.cuda_ipc import CudaReader

        return CudaReader(welcome.descriptor, welcome.slots, welcome.slot_bytes)
    raise ValueError(f"unknown data plane {welcome.plane!r}")
