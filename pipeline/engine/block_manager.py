"""KV-cache block allocation: a pool of 16-token blocks with reference counts and a prefix-cache registry.

Blocks are shared by reference count: requests with a common prefix (a session's next turn and its
history, a repeated system prompt) hold one copy of it. A full block whose contents are known can be
registered under its chain hash (:mod:`.prefix_cache`; so is a request's last, partly filled block when the
request lets it go); when its last reference goes, it stays in the pool
as a *cached free* block: still findable by hash, reusable by a later request, and evicted (its hash
dropped) only when an allocation finds no never-cached block left, least recently released first.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from omniduplex.models.forward_batch import BLOCK_SIZE


class NoFreeBlocks(RuntimeError):
    """The allocator cannot satisfy a request; the scheduler preempts or waits."""


def blocks_for(num_tokens: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // BLOCK_SIZE)


class BlockAllocator:
    """Reference-counted pool of ``num_blocks`` physical KV blocks.

    ``allocate(n)`` returns ``n`` blocks with refcount 1 (taking never-cached free blocks first, then
    evicting cached free blocks LRU) or raises :class:`NoFreeBlocks`; ``fork(ids)`` adds a reference;
    ``free(ids)`` drops one and returns blocks at zero to the pool. Prefix caching: ``register(id, h)``
    names a full, computed block by its chain hash ``h``; ``lookup(h)`` finds it while it has not been
    evicted; ``touch(id)`` takes a reference on a found block (reviving it if it was free).

    ``num_free`` counts every block an allocation may take, cached free blocks included.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # free, no hash: taken first
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free, hashed: LRU order, oldest first
        self._ref = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}
        self._by_hash: dict[bytes, int] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached(self) -> int:
        """Blocks registered under a hash (held or free)."""
        return len(self._by_hash)

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise NoFreeBlocks(f"need {n} KV blocks, {self.num_free} free of {self.num_blocks}")
        ids = []
        for _ in range(n):
            if self._free:
                i = self._free.popleft()
            else:  # evict the least recently released cached block
                i, _ = self._cached_free.popitem(last=False)
                del self._by_hash[self._hash_of.pop(i)]
                self.num_evictions += 1
            self._ref[i] = 1
            ids.append(i)
        return ids

    def fork(self, ids: list[int]) -> list[int]:
        for i in ids:
            if self._ref[i] <= 0:
                raise ValueError(f"cannot share free block {i}")
            self._ref[i] += 1
        return list(ids)

    def free(self, ids: list[int]) -> None:
        """Drop one reference of each block, in order (so free a block table tail first: the tail is evicted
        before the prefix it extends). Raises ValueError on a block that is already free."""
        for i in ids:
            if self._ref[i] <= 0:
                raise ValueError(f"double free of block {i}")
            self._ref[i] -= 1
            if self._ref[i] == 0:
                if i in self._hash_of:
                    self._cached_free[i] = None
                else:
                    self._free.append(i)

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]

    # -- prefix caching ----------------------------------------------------------------------------------
    def lookup(self, block_hash: bytes) -> int | None:
        """The block registered under ``block_hash``, held or cached free; ``None`` if absent or evicted."""
        return self._by_hash.get(block_hash)

    def touch(self, block_id: int) -> None:
        """Take a reference on a block found by :meth:`lookup` (a cached free block leaves the free pool)."""
        if self._ref[block_id] == 0:
            del self._cached_free[block_id]
        self._ref[block_id] += 1

    def register(self, block_id: int, block_hash: bytes) -> bool:
        """Name held, full, computed ``block_id`` by its chain hash. False (nothing changes) when another
        block already holds that hash or this block already has one.

        Raises:
            ValueError: the block is free (its contents may be overwritten at any time).
        """
        if self._ref[block_id] <= 0:
            raise ValueError(f"cannot register free block {block_id}")
        if block_hash in self._by_hash or block_id in self._hash_of:
            return False
        self._by_hash[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    def unregister(self, block_id: int) -> None:
        """Drop the hash of held ``block_id`` (its holder is about to change its contents).

        Raises:
            ValueError: the block is free.
        """
        if self._ref[block_id] <= 0:
            raise ValueError(f"cannot unregister free block {block_id}")
        h = self._hash_of.pop(block_id, None)
        if h is not None:
            del self._by_hash[h]

    def block_hash(self, block_id: int) -> bytes | None:
        """The hash ``block_id`` is registered under, if any."""
        return self._hash_of.get(block_id)
