"""KV-cache block allocation: a free list of 16-token blocks with reference counts.

Blocks are shared by reference count (``fork``) so that requests with a common prefix, such as a
CFG companion and its main request or a repeated system prompt, hold one copy of that prefix.
"""

from __future__ import annotations

from collections import deque

from omniduplex.models.forward_batch import BLOCK_SIZE


class NoFreeBlocks(RuntimeError):
    """The allocator cannot satisfy a request; the scheduler preempts or waits."""


def blocks_for(num_tokens: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // BLOCK_SIZE)


class BlockAllocator:
    """Reference-counted pool of ``num_blocks`` physical KV blocks.

    ``allocate(n)`` returns ``n`` fresh block ids (refcount 1) or raises :class:`NoFreeBlocks`;
    ``fork(ids)`` adds a reference; ``free(ids)`` drops one and returns blocks at zero to the pool.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._ref = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise NoFreeBlocks(f"need {n} KV blocks, {len(self._free)} free of {self.num_blocks}")
        ids = [self._free.popleft() for _ in range(n)]
        for i in ids:
            self._ref[i] = 1
        return ids

    def fork(self, ids: list[int]) -> list[int]:
        for i in ids:
            if self._ref[i] <= 0:
                raise ValueError(f"cannot share free block {i}")
            self._ref[i] += 1
        return list(ids)

    def free(self, ids: list[int]) -> None:
        for i in ids:
            if self._ref[i] <= 0:
                raise ValueError(f"double free of block {i}")
            self._ref[i] -= 1
            if self._ref[i] == 0:
                self._free.append(i)

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]
