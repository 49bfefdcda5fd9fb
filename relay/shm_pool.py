"""Shared-memory slot pool of an edge, and the janitor that unlinks segments of dead owners.

One POSIX shared-memory segment per edge (a file in ``/dev/shm``) holds ``slots`` slots of
``slot_bytes`` bytes each, pre-faulted at creation so the pool's memory is committed once and stays
flat. The segment is named ``omniduplex-<owner pid>-<edge>-<nonce>``: the owner (the producer)
unlinks it on ``close``, on garbage collection and at interpreter exit; after a crash,
:func:`sweep_orphans` (run by every new producer and by a consumer that saw its producer die)
unlinks every segment whose owner pid is gone. The segment is opened with ``os.open`` + ``mmap``
rather than ``multiprocessing.shared_memory``, so Python's resource tracker never sees (or
double-unlinks) it. Linux only.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import time
import weakref

import numpy as np
import torch

SHM_DIR = "/dev/shm"
PREFIX = "omniduplex"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-")


def _slug(edge: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", edge)[:64]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    # state is the field after the parenthesised command name
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def list_segments(pid: int | None = None, shm_dir: str = SHM_DIR) -> list[str]:
    """Names of the relay's segments in ``shm_dir`` (only those owned by ``pid`` if given)."""
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _NAME.match(name)
        if m and (pid is None or int(m.group(1)) == pid):
            out.append(name)
    return sorted(out)


def sweep_orphans(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every relay segment whose owner process is dead; return the names removed."""
    removed = []
    for name in list_segments(shm_dir=shm_dir):
        pid = int(_NAME.match(name).group(1))
        if pid != os.getpid() and not pid_alive(pid):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def sweep_after_exit(pid: int, timeout_s: float = 2.0, shm_dir: str = SHM_DIR) -> list[str]:
    """Wait up to ``timeout_s`` seconds for process ``pid`` to finish dying, then :func:`sweep_orphans`.

    A peer whose socket just closed may still be tearing down; its segments are left alone if it
    is still alive after the wait (a live owner unlinks its own segments).
    """
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sweep_orphans(shm_dir)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class ShmSlotPool:
    """``slots`` slots of ``slot_bytes`` bytes in one shared-memory segment.

    Create it on the producer with :meth:`create` (owner: unlinks the segment), open it on the
    consumer with :meth:`attach`. ``array`` is the whole segment as a ``uint8`` numpy array.
    """

    def __init__(self, name: str, slots: int, slot_bytes: int, *, owner: bool,
                 shm_dir: str = SHM_DIR) -> None:
        """Map segment ``name`` (created and pre-faulted if ``owner``); see :meth:`create`/:meth:`attach`."""
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"need at least one slot of at least one byte, got {slots} x {slot_bytes} B")
        self.name = name
        self.path = os.path.join(shm_dir, name)
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.owner = owner
        size = slots * slot_bytes
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if owner else 0)
        fd = os.open(self.path, flags, 0o600)
        self._finalizer = weakref.finalize(self, _unlink, self.path) if owner else None
        try:
            if owner:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"segment {name} holds {os.fstat(fd).st_size} B, expected {size} B")
            self._mmap = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        except BaseException:
            os.close(fd)
            self.close()
            raise
        os.close(fd)
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)
        if owner:
            self.array[:: mmap.PAGESIZE] = 0  # commit every page now: memory stays flat afterwards

    @classmethod
    def create(cls, edge: str, slots: int, slot_bytes: int, shm_dir: str = SHM_DIR) -> ShmSlotPool:
        """New segment for ``edge`` owned by this process (sweeps orphans of dead owners first)."""
        sweep_orphans(shm_dir)
        name = f"{PREFIX}-{os.getpid()}-{_slug(edge)}-{secrets.token_hex(4)}"
        return cls(name, slots, slot_bytes, owner=True, shm_dir=shm_dir)

    @classmethod
    def attach(cls, name: str, slots: int, slot_bytes: int, shm_dir: str = SHM_DIR) -> ShmSlotPool:
        """Map the existing segment ``name`` (consumer side; never unlinks it)."""
        if "/" in name or not name.startswith(PREFIX):
            raise ValueError(f"not a relay segment name: {name!r}")
        return cls(name, slots, slot_bytes, owner=False, shm_dir=shm_dir)

    def slot(self, i: int) -> np.ndarray:
        """Slot ``i`` as a ``uint8`` numpy view of ``slot_bytes`` bytes."""
        return self.array[i * self.slot_bytes:(i + 1) * self.slot_bytes]

    def close(self) -> None:
        """Unmap the segment, and unlink it if this process owns it. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # unlink first: that is what frees /dev/shm even if a view is still held
        self.array = None
        mm = getattr(self, "_mmap", None)
        if mm is not None:
            self._mmap = None
            with contextlib.suppress(BufferError):  # a view is still held; the mapping goes with it
                mm.close()


class ShmWriter:
    """Producer side of the shared-memory data plane: copies tensor bytes straight into slots."""

    kind = "shm"

    def __init__(self, edge: str, slots: int, slot_bytes: int) -> None:
        self.pool = ShmSlotPool.create(edge, slots, slot_bytes)
        self.descriptor = self.pool.name.encode()
        self._cuda = False

    def put(self, slot: int, offset: int, src: np.ndarray | torch.Tensor) -> None:
        """Copy ``src`` (flat bytes: numpy, or a torch tensor on a GPU) to ``slot`` at byte ``offset``."""
        start = slot * self.pool.slot_bytes + offset
        if isinstance(src, np.ndarray):
            np.copyto(self.pool.array[start:start + src.shape[0]], src)
        else:
            torch.from_numpy(self.pool.array[start:start + src.numel()]).copy_(src, non_blocking=True)
            self._cuda = True

    def take_frames(self) -> list:
        """Extra ZMQ frames for the fragment: none, the bytes are in the slots."""
        if self._cuda:
            torch.cuda.current_stream().synchronize()
            self._cuda = False
        return []

    def release(self, timeout_s: float) -> None:
        """Nothing to wait for: the bytes were copied into the slots."""

    def close(self) -> None:
        """Unlink and unmap the pool."""
        self.pool.close()


class ShmReader:
    """Consumer side of the shared-memory data plane: copies slot bytes into fresh CPU tensors."""

    device = torch.device("cpu")

    def __init__(self, descriptor: bytes, slots: int, slot_bytes: int) -> None:
        self.pool = ShmSlotPool.attach(descriptor.decode(), slots, slot_bytes)

    def begin(self, frames: list) -> None:
        """Start reading a fragment (the shm plane carries no extra frames)."""

    def get(self, slot: int, offset: int, dst: np.ndarray) -> None:
        """Copy bytes ``[offset, offset+len(dst))`` of ``slot`` into ``dst`` (flat ``uint8``)."""
        start = slot * self.pool.slot_bytes + offset
        np.copyto(dst, self.pool.array[start:start + dst.shape[0]])

    def finish(self) -> None:
        """Done with the fragment's slots (CPU copies are synchronous)."""

    def close(self) -> None:
        """Unmap the pool (the producer owns and unlinks it)."""
        self.pool.close()
