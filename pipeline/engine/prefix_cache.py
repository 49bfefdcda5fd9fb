"""Automatic prefix caching: full KV blocks named by a hash chain over their inputs, reused across requests.

Block ``k`` of a request covers input rows ``16k .. 16k + 15``. Its hash is
``blake2b(hash(k - 1) ‖ ids of the rows ‖ content key of the rows)``, so equal hashes mean equal inputs
from row 0 on, hence equal KV (same positions, same causal context). The content key covers what ids do
not: rows given as embeddings (``prompt_embeds``, e.g. audio rows merged into a Thinker prompt, or a
Talker's ``decode_embeds``) are keyed by the bytes of those rows; an adapter with other inputs (the unified
LM's multi-stream step tokens) supplies ``row_key(req, start, end)``.

At admission a request takes the longest chain of registered blocks matching its known inputs, capped so
that at least its last input row is recomputed (its logits are needed) and at most
``adapter.cacheable_rows(req)`` rows are skipped (an adapter that records per-row side outputs, like the
Thinker's hidden states for the Talker, limits it). After every forward, the request's newly completed
blocks are registered. Blocks stay findable after release until the allocator evicts them
(:class:`.block_manager.BlockAllocator`).

The last, partly filled block of a request of plain token rows is kept too when the request drops its KV
(finished, aborted, preempted): registered under the chain hash of the rows it holds and indexed by its
parent's hash. A later request whose rows after its matched full blocks begin with some of those rows takes
the block over (it leaves the registry; the newcomer overwrites the rows after the common ones), so a prompt
that extends an earlier one by a few tokens (a prefill hint of the words heard so far, then the turn) reuses
every row they share, not only whole blocks (token-granular reuse of the tail, as in SGLang's radix cache,
Zheng et al. 2024; vLLM's automatic prefix caching reuses full blocks only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.pipeline.engine.block_manager import BlockAllocator
from omniduplex.pipeline.engine.request import Request

RowKey = Callable[[Request, int, int], "bytes | None"]
"""``(request, start, end) → bytes``: content of input rows ``start..end`` beyond their ids (or ``None``)."""


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of ``t`` (any dtype, bf16 included), row-major; a content key for embedding rows."""
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def chain_hash(parent: bytes | None, ids: list[int], content: bytes | None = None) -> bytes:
    """Hash of one full block: 16-byte blake2b over the parent block's hash, the rows' token ids (int64
    little-endian) and their content key. ``parent`` is ``None`` for block 0."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"\0" * 16)
    h.update(len(ids).to_bytes(4, "little"))
    h.update(b"".join(i.to_bytes(8, "little", signed=True) for i in ids))
    if content is not None:
        h.update(b"\1")
        h.update(content)
    return h.digest()


def default_row_key(req: Request, start: int, end: int) -> bytes | None:
    """Content key of rows ``start..end`` of an id/embedding request: the bytes of the prompt embedding rows
    (``prompt_embeds``) and of the decode embedding rows (``embed_inputs``) in the range, else ``None``."""
    parts = []
    p = req.num_prompt
    if req.prompt_embeds is not None and start < p:
        parts.append(tensor_bytes(req.prompt_embeds[start : min(end, p)]))
    if req.embed_inputs and end > p:
        parts.append(tensor_bytes(torch.stack(req.decode_embeds[max(start, p) - p : end - p])))
    return b"".join(parts) if parts else None


class PrefixCache:
    """Matches and registers a request's full blocks in ``allocator``'s hash registry.

    Args:
        allocator: the KV block pool (holds the hash → block registry and the LRU of cached free blocks).
        row_key: content key of input rows beyond their ids (default :func:`default_row_key`).
        cacheable_rows: ``req → int``, most leading rows whose computation may be skipped (default: all).
    """

    def __init__(
        self,
        allocator: BlockAllocator,
        row_key: RowKey | None = None,
        cacheable_rows: Callable[[Request], int] | None = None,
    ) -> None:
        self.allocator = allocator
        self.row_key = row_key or default_row_key
        self.cacheable_rows = cacheable_rows
        # parent hash (b"" for block 0) -> [(hash, row ids)] of partly filled blocks offered at release;
        # entries whose block was evicted or taken are dropped lazily
        self._partials: dict[bytes, list[tuple[bytes, tuple[int, ...]]]] = {}
        self._num_partials = 0

    def _hashes(self, req: Request, num_blocks: int) -> list[bytes]:
        """``req.block_hashes`` extended to ``num_blocks`` full blocks (rows must be known inputs)."""
        hs = req.block_hashes
        if len(hs) < num_blocks:
            seq = req.prompt_ids + req.output_ids if len(req.prompt_ids) < num_blocks * BLOCK_SIZE else None
            for k in range(len(hs), num_blocks):
                a, b = k * BLOCK_SIZE, (k + 1) * BLOCK_SIZE
                ids = seq[a:b] if seq is not None else req.prompt_ids[a:b]
                hs.append(chain_hash(hs[-1] if hs else None, ids, self.row_key(req, a, b)))
        return hs

    def match(self, req: Request) -> int:
        """Give a request that holds no blocks the cached blocks of its longest matching prefix.

        Sets ``req.blocks`` (one reference taken on each) and ``req.num_computed``; returns the rows reused.
        """
        assert not req.blocks and req.num_computed == 0
        limit = req.num_inputs - 1  # the last input row is always computed: its logits are sampled
        if self.cacheable_rows is not None:
            limit = min(limit, self.cacheable_rows(req))
        limit = max(0, limit)
        n = limit // BLOCK_SIZE
        hs = self._hashes(req, n)
        found = []
        for h in hs:
            b = self.allocator.lookup(h)
            if b is None:
                break
            found.append(b)
        for b in found:
            self.allocator.touch(b)
        k = len(found)
        req.blocks = found
        req.num_computed = k * BLOCK_SIZE
        req.num_registered = k
        if limit > k * BLOCK_SIZE:
            self._take_partial(req, hs[k - 1] if k else b"", min(limit, (k + 1) * BLOCK_SIZE))
        return req.num_computed

    def _take_partial(self, req: Request, parent: bytes, end: int) -> None:
        """Append the cached partial block after ``parent`` that shares the most leading rows with ``req``'s
        rows ``num_computed .. end`` (taken over: unregistered, one reference), if any."""
        entries = self._partials.get(parent)
        start = req.num_computed
        if not entries or self.row_key(req, start, end) is not None:
            return
        ids = _row_ids(req, start, end)
        best, best_block, best_m = None, -1, 0
        for entry in list(entries):
            b = self.allocator.lookup(entry[0])
            if b is None:  # evicted since
                entries.remove(entry)
                continue
            m = next(
                (i for i, (x, y) in enumerate(zip(entry[1], ids)) if x != y), min(len(entry[1]), len(ids))
            )
            if m > best_m and self.allocator.refcount(b) == 0:
                best, best_block, best_m = entry, b, m
        if best is None:
            return
        entries.remove(best)
        b = best_block
        self.allocator.touch(b)
        self.allocator.unregister(b)
        req.blocks.append(b)
        req.num_computed += best_m

    def release(self, req: Request) -> None:
        """Before ``req`` drops its KV: keep its last, partly filled block findable (see the module
        docstring). Only a block of plain token rows (no content key) that ``req`` alone holds."""
        k, m = divmod(req.num_computed, BLOCK_SIZE)
        if m == 0 or k >= len(req.blocks) or self.allocator.refcount(req.blocks[k]) != 1:
            return
        start, end = k * BLOCK_SIZE, req.num_computed
        if self.row_key(req, start, end) is not None:
            return
        ids = _row_ids(req, start, end)
        parent = self._hashes(req, k)[k - 1] if k else b""
        h = chain_hash(parent or None, list(ids))
        if not self.allocator.register(req.blocks[k], h):
            return
        self._partials.setdefault(parent, []).append((h, ids))
        self._num_partials += 1
        if self._num_partials > 2 * self.allocator.num_blocks:  # drop the entries of evicted blocks
            live = {
                p: [e for e in es if self.allocator.lookup(e[0]) is not None]
                for p, es in self._partials.items()
            }
            self._partials = {p: es for p, es in live.items() if es}
            self._num_partials = sum(len(es) for es in self._partials.values())

    def register(self, req: Request) -> None:
        """Register the request's blocks completed by its computed rows (call after every forward)."""
        full = min(req.num_computed // BLOCK_SIZE, len(req.blocks))
        if full <= req.num_registered:
            return
        hs = self._hashes(req, full)
        for k in range(req.num_registered, full):
            self.allocator.register(req.blocks[k], hs[k])
        req.num_registered = full


def _row_ids(req: Request, start: int, end: int) -> tuple[int, ...]:
    """Token ids of input rows ``start .. end`` of ``req`` (prompt rows, then fed output rows)."""
    p = req.num_prompt
    ids = list(req.prompt_ids[start : min(end, p)])
    if end > p:
        ids += req.output_ids[max(start, p) - p : end - p]
    return tuple(ids)
