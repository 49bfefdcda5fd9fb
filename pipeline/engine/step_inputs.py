"""A step's host work: block tables kept incrementally on the host, attention metadata written into one
persistent (pinned on CUDA) host buffer and sent to the device with one ``non_blocking`` copy.

:class:`BlockTables` holds every request's block table in a host array, one row per engine slot. A row is
written only when its request gets blocks: appended blocks are written alone, a new list (after a preemption
or a prefix-cache match) rewrites the row. A step gathers the rows it needs with one vectorised index; no
Python list of lists is rebuilt into a tensor.

:class:`PackedUpload` lays out typed sections (int64 positions, int32 block tables, …) in one host buffer
mirrored on the device; a step fills a prefix of it with numpy and copies that prefix with one
``non_blocking`` copy (vLLM's persistent pinned ``CpuGpuBuffer``s, here one buffer). On the CPU the host
buffer is the device buffer: nothing is copied. :class:`StepInputs` builds the engine's
:class:`ForwardBatch` of an eager step and fills the static inputs of a replayed decode step
(:mod:`.decode_graphs`) this way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omniduplex.models.forward_batch import BLOCK_SIZE, ForwardBatch
from omniduplex.pipeline.engine.request import Request

_ALIGN = 8


class PackedUpload:
    """Named typed sections of one host buffer and its device mirror.

    Args:
        sections: ``(name, dtype, numel)`` in layout order.
        device: where the mirror lives. CUDA: the host buffer is pinned and :meth:`upload` copies a prefix
            with one ``non_blocking`` copy; CPU: the mirror is the host buffer itself.
        mirror: keep a separate mirror even on the CPU (tests exercise the copy path this way).

    ``host[name]`` (numpy) and ``device_views[name]`` (torch) are views of the whole section. :meth:`end` is
    the byte offset just past ``numel`` elements of a section, the prefix to upload.
    """

    def __init__(
        self, sections: Sequence[tuple[str, torch.dtype, int]], device: torch.device, mirror: bool = False
    ) -> None:
        self.device = device
        self.offsets: dict[str, tuple[int, torch.dtype]] = {}
        at = 0
        for name, dtype, numel in sections:
            self.offsets[name] = (at, dtype)
            at += -(-(numel * dtype.itemsize) // _ALIGN) * _ALIGN
        self.nbytes = max(at, _ALIGN)
        pinned = device.type == "cuda"
        self.host_buffer = torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=pinned)
        copy = device.type != "cpu" or mirror
        self.device_buffer = (
            torch.zeros(self.nbytes, dtype=torch.uint8, device=device) if copy else self.host_buffer
        )
        self.host: dict[str, np.ndarray] = {}
        self.device_views: dict[str, torch.Tensor] = {}
        sizes = {name: numel for name, _, numel in sections}
        for name, (off, dtype) in self.offsets.items():
            span = slice(off, off + sizes[name] * dtype.itemsize)
            self.host[name] = self.host_buffer[span].view(dtype).numpy()
            self.device_views[name] = self.device_buffer[span].view(dtype)
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self.num_uploads = 0

    def end(self, name: str, numel: int) -> int:
        """Byte offset just past the first ``numel`` elements of section ``name``."""
        off, dtype = self.offsets[name]
        return off + numel * dtype.itemsize

    def writable(self) -> None:
        """Wait until the last upload has left the host buffer (call before writing it; free when done)."""
        if self._copied is not None:
            self._copied.synchronize()

    def upload(self, nbytes: int) -> None:
        """Copy the first ``nbytes`` bytes to the device mirror (one copy; none without a mirror)."""
        if self.device_buffer is self.host_buffer:
            return
        self.device_buffer[:nbytes].copy_(self.host_buffer[:nbytes], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.num_uploads += 1


class BlockTables:
    """Every request's block table on the host: int32 ``table[slot, k]`` = block ``k`` of the request holding
    engine slot ``slot``. Rows and width grow on demand (a reallocation, never per step)."""

    def __init__(self, rows: int = 8, width: int = 16) -> None:
        self.table = np.zeros((max(rows, 1), max(width, 1)), dtype=np.int32)
        self._lists: list[list[int] | None] = [None] * self.table.shape[0]
        self._synced = [0] * self.table.shape[0]
        self.num_row_writes = 0

    def _grow(self, rows: int, width: int) -> None:
        r, w = self.table.shape
        if rows <= r and width <= w:
            return
        new = np.zeros((max(rows, r), max(width, w)), dtype=np.int32)
        new[:r, :w] = self.table
        self.table = new
        self._lists += [None] * (new.shape[0] - r)
        self._synced += [0] * (new.shape[0] - r)

    def sync(self, req: Request) -> None:
        """Bring the row of ``req.slot`` up to date with ``req.blocks``: nothing when unchanged, the appended
        blocks when the list grew in place, the whole row when it is a new list."""
        r, blocks = req.slot, req.blocks
        if r >= len(self._lists) or len(blocks) > self.table.shape[1]:
            self._grow(r + 1, 2 * len(blocks))
        n = len(blocks)
        if self._lists[r] is blocks:
            start = self._synced[r]
            if start == n:
                return
        else:
            start = 0
        if start < n:
            self.table[r, start:n] = blocks[start:]
        self._lists[r], self._synced[r] = blocks, n
        self.num_row_writes += 1

    def release(self, slot: int) -> None:
        """Forget the list of a freed slot (its next request rewrites the row)."""
        if slot < len(self._lists):
            self._lists[slot], self._synced[slot] = None, 0


class StepInputs:
    """The attention metadata of every step, through :class:`PackedUpload` buffers.

    Args:
        device: of the model and its KV cache.
        max_num_seqs, max_num_batched_tokens: the engine's limits (initial capacities of the eager buffer,
            which grows if a step needs more: a CFG pair may exceed the token budget).
        mirror: a separate device mirror even on the CPU (tests).
    """

    def __init__(
        self, device: torch.device, max_num_seqs: int, max_num_batched_tokens: int, mirror: bool = False
    ) -> None:
        self.device, self.mirror = device, mirror
        self.tables = BlockTables(max_num_seqs, 16)
        self._eager: PackedUpload | None = None
        self._eager_caps = (max(max_num_batched_tokens, 1), max(max_num_seqs, 1), 16 * max(max_num_seqs, 1))
        self.graph: PackedUpload | None = None
        self.graph_width = 0

    def _eager_buffer(self, tokens: int, seqs: int, table: int) -> PackedUpload:
        t, s, w = self._eager_caps
        if self._eager is None or tokens > t or seqs > s or table > w:
            t, s, w = max(tokens, t), max(seqs, s), max(table, w)
            if self._eager is not None:  # grow with room to spare: reallocations stay rare
                t, s, w = max(t, tokens * 5 // 4), max(s, seqs * 5 // 4), max(w, table * 5 // 4)
            self._eager_caps = (t, s, w)
            self._eager = PackedUpload(
                [
                    ("positions", torch.int64, t),
                    ("slot_mapping", torch.int64, t),
                    ("seq_lens", torch.int32, s),
                    ("query_start_loc", torch.int32, s + 1),
                    ("block_tables", torch.int32, w),
                ],
                self.device,
                self.mirror,
            )
        return self._eager

    def eager_batch(self, items: list[tuple[Request, int]]) -> ForwardBatch:
        """The :class:`ForwardBatch` of ``items`` (``(request, rows)`` in batch order, rows from each
        request's ``num_computed``): its tensors are views of the device buffer, valid until the next step."""
        s = len(items)
        starts = [r.num_computed for r, _ in items]
        ns = [n for _, n in items]
        for r, _ in items:
            self.tables.sync(r)
        ends = [a + n for a, n in zip(starts, ns)]
        t, max_end = sum(ns), max(ends)
        width = max(1, -(-max_end // BLOCK_SIZE))
        buf = self._eager_buffer(t, s, s * width)
        buf.writable()
        h = buf.host
        if t == s:  # one row per sequence (decodes): Python lists, no array work for a few scalars
            h["positions"][:t] = starts
            h["slot_mapping"][:t] = [
                r.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for (r, _), p in zip(items, starts)
            ]
            h["query_start_loc"][: s + 1] = np.arange(s + 1)
        else:
            qsl = h["query_start_loc"][: s + 1]
            qsl[0] = 0
            np.cumsum(ns, out=qsl[1:])
            tok_seq = np.repeat(np.arange(s), ns)
            pos = np.arange(t) - qsl[:-1][tok_seq] + np.asarray(starts)[tok_seq]
            tok_rows = np.asarray([r.slot for r, _ in items])[tok_seq]
            h["positions"][:t] = pos
            slots = self.tables.table[tok_rows, pos // BLOCK_SIZE] * BLOCK_SIZE
            np.add(slots, pos % BLOCK_SIZE, out=h["slot_mapping"][:t])
        h["seq_lens"][:s] = ends
        table = self.tables.table
        if s == 1:
            h["block_tables"][:width] = table[items[0][0].slot, :width]
        else:
            rows = [r.slot for r, _ in items]
            h["block_tables"][: s * width].reshape(s, width)[:] = table[rows, :width]
        buf.upload(buf.end("block_tables", s * width))
        d = buf.device_views
        return ForwardBatch(
            positions=d["positions"][:t],
            slot_mapping=d["slot_mapping"][:t],
            block_tables=d["block_tables"][: s * width].view(s, width),
            seq_lens=d["seq_lens"][:s],
            query_start_loc=d["query_start_loc"][: s + 1],
            max_seq_len=max_end,
            max_query_len=max(ns),
            seq_lens_host=ends,
        )

    def row_batch(self, items: list[tuple[Request, int]]) -> ForwardBatch:
        """A decode-shaped :class:`ForwardBatch` of ``items`` whose requests each run ``n`` rows from their
        ``num_computed`` (a decode and its speculative drafts): every row is a query of its own over the
        request's block table, attending up to its position. Layers write a step's K/V rows before they
        attend, so row ``i`` sees rows ``< i`` of the same step: the causal attention of the multi-row decode,
        on the one-query decode kernels (and the one-call quantized layers), each row computed as a plain
        decode step would compute it."""
        rows = [(r, p) for r, n in items for p in range(r.num_computed, r.num_computed + n)]
        for r, _ in items:
            self.tables.sync(r)
        t = len(rows)
        max_end = max(p for _, p in rows) + 1
        width = max(1, -(-max_end // BLOCK_SIZE))
        buf = self._eager_buffer(t, t, t * width)
        buf.writable()
        h = buf.host
        pos = [p for _, p in rows]
        h["positions"][:t] = pos
        h["slot_mapping"][:t] = [r.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for r, p in rows]
        h["query_start_loc"][: t + 1] = np.arange(t + 1)
        h["seq_lens"][:t] = [p + 1 for p in pos]
        h["block_tables"][: t * width].reshape(t, width)[:] = self.tables.table[
            [r.slot for r, _ in rows], :width
        ]
        buf.upload(buf.end("block_tables", t * width))
        d = buf.device_views
        return ForwardBatch(
            positions=d["positions"][:t],
            slot_mapping=d["slot_mapping"][:t],
            block_tables=d["block_tables"][: t * width].view(t, width),
            seq_lens=d["seq_lens"][:t],
            query_start_loc=d["query_start_loc"][: t + 1],
            max_seq_len=max_end,
            max_query_len=1,
            seq_lens_host=[p + 1 for p in pos],
        )

    # -- the static inputs of replayed decode steps -----------------------------------------------------
    def setup_graph(self, max_batch: int, width: int) -> None:
        """Allocate the static decode inputs: ``max_batch`` rows, block tables ``width`` blocks wide (the
        longest context a replayed step may hold is ``width * 16`` tokens). All rows start as padding."""
        self.graph_width = width
        self.graph = PackedUpload(
            [
                ("input_ids", torch.int64, max_batch),
                ("positions", torch.int64, max_batch),
                ("slot_mapping", torch.int64, max_batch),
                ("seq_lens", torch.int32, max_batch),
                ("query_start_loc", torch.int32, max_batch + 1),
                ("block_tables", torch.int32, max_batch * width),
            ],
            self.device,
            self.mirror,
        )
        self.graph.host["query_start_loc"][:] = np.arange(max_batch + 1)
        self.tables._grow(1, width)
        self._pad(0, max_batch)
        self.graph.upload(self.graph.nbytes)

    def graph_batch(self, bucket: int) -> tuple[torch.Tensor, ForwardBatch]:
        """``(input_ids, ForwardBatch)`` of a decode step of ``bucket`` rows over the static buffers: what a
        captured graph reads. ``max_seq_len`` is the fixed bound ``width * 16``, not read from the device."""
        d, w = self.graph.device_views, self.graph_width
        batch = ForwardBatch(
            positions=d["positions"][:bucket],
            slot_mapping=d["slot_mapping"][:bucket],
            block_tables=d["block_tables"][: bucket * w].view(bucket, w),
            seq_lens=d["seq_lens"][:bucket],
            query_start_loc=d["query_start_loc"][: bucket + 1],
            max_seq_len=w * BLOCK_SIZE,
            max_query_len=1,
        )
        return d["input_ids"][:bucket], batch

    def _pad(self, start: int, stop: int) -> None:
        """Rows ``start:stop`` of the static inputs as padding: id 0 at position 0, slot -1 (no KV write),
        one cached token read from block 0 (finite values, never NaN)."""
        h, w = self.graph.host, self.graph_width
        h["input_ids"][start:stop] = 0
        h["positions"][start:stop] = 0
        h["slot_mapping"][start:stop] = -1
        h["seq_lens"][start:stop] = 1
        h["block_tables"][start * w : stop * w] = 0

    def fill_decode(self, items: list[tuple[Request, int]], bucket: int, ids: list[int] | None) -> bool:
        """Write a decode-only step (one row per request) into the static inputs, padded to ``bucket`` rows,
        and upload them (one copy). Returns ``False``, writing nothing, when a request holds more blocks than
        the static block table is wide."""
        n, w = len(items), self.graph_width
        for r, _ in items:
            if len(r.blocks) > w:
                return False
        for r, _ in items:
            self.tables.sync(r)
        pos = [r.num_computed for r, _ in items]
        buf = self.graph
        buf.writable()
        h, table = buf.host, self.tables.table
        if ids is not None:
            h["input_ids"][:n] = ids
        h["positions"][:n] = pos
        h["slot_mapping"][:n] = [
            r.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for (r, _), p in zip(items, pos)
        ]
        h["seq_lens"][:n] = [p + 1 for p in pos]
        if n == 1:
            h["block_tables"][:w] = table[items[0][0].slot, :w]
        else:
            h["block_tables"][: n * w].reshape(n, w)[:] = table[[r.slot for r, _ in items], :w]
        if n < bucket:
            self._pad(n, bucket)
        buf.upload(buf.end("block_tables", bucket * w))
        return True
