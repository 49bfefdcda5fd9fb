"""Frames data plane: the tensor bytes travel as zero-copy ZMQ frames next to the control message.

Used for edges whose stages may sit on different hosts (``tcp://`` addresses). The interface and the
credit protocol are the shared-memory plane's: a "slot" is a virtual window of ``slot_bytes``
bytes, so at most ``slots * slot_bytes`` bytes of one edge are in flight and the consumer's memory
stays bounded exactly as with shared memory. On send, frames point at the producer's tensors (no
copy; the producer waits until ZMQ has released them before ``send`` returns). On receive, each
frame is copied once into the fresh output tensor.
"""

from __future__ import annotations

import numpy as np
import torch
import zmq

#: Below this size a frame is copied into the ZMQ message (cheaper than tracking a zero-copy buffer).
ZERO_COPY_MIN_BYTES = 64 * 1024


def tcp_address(host: str = "127.0.0.1", port: int | str = "*") -> str:
    """``tcp://host:port``; ``port='*'`` binds an ephemeral port (read it from ``EdgeProducer.address``)."""
    return f"tcp://{host}:{port}"


class FrameWriter:
    """Producer side: each piece of a fragment becomes one ZMQ frame referencing the tensor's memory."""

    kind = "frames"
    descriptor = b""

    def __init__(self) -> None:
        self._frames: list = []
        self._trackers: list = []

    def put(self, slot: int, offset: int, src: np.ndarray | torch.Tensor) -> None:
        """Queue ``src`` (flat bytes) as the next frame; a GPU tensor is staged through the host."""
        arr = src if isinstance(src, np.ndarray) else src.cpu().numpy()
        if arr.nbytes < ZERO_COPY_MIN_BYTES:
            self._frames.append(zmq.Frame(arr, copy=True))
        else:
            frame = zmq.Frame(arr, copy=False, track=True)
            self._trackers.append(frame.tracker)
            self._frames.append(frame)

    def take_frames(self) -> list:
        """The frames of the fragment, in payload order."""
        out, self._frames = self._frames, []
        return out

    def release(self, timeout_s: float) -> None:
        """Wait until ZMQ no longer references the sent tensors (so the caller may reuse them)."""
        try:
            for tracker in self._trackers:
                tracker.wait(timeout_s)
        except zmq.NotDone:
            from omniduplex.relay.errors import BackpressureTimeout

            raise BackpressureTimeout(f"ZMQ still held the sent tensors after {timeout_s:.3g} s") from None
        finally:
            self._trackers = []

    def close(self) -> None:
        """Drop queued frames."""
        self._frames = []
        self._trackers = []


class FrameReader:
    """Consumer side: copies each received frame into the output tensor's bytes."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self._frames: list = []
        self._next = 0

    def begin(self, frames: list) -> None:
        """Start reading a fragment whose pieces arrived as ``frames`` (in payload order)."""
        self._frames = frames
        self._next = 0

    def get(self, slot: int, offset: int, dst: np.ndarray) -> None:
        """Copy the next frame into ``dst`` (flat ``uint8``); raises ``ValueError`` on a size mismatch."""
        frame = self._frames[self._next]
        self._next += 1
        buf = frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)
        if buf.nbytes != dst.shape[0]:
            raise ValueError(f"frame of {buf.nbytes} B for a piece of {dst.shape[0]} B")
        np.copyto(dst, np.frombuffer(buf, dtype=np.uint8))

    def finish(self) -> None:
        """Release the fragment's frames."""
        self._frames = []

    def close(self) -> None:
        """Nothing to release."""
        self._frames = []
