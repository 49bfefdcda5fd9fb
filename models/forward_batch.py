"""The flat-token batch a decoder forward runs on, and the paged KV cache it reads and writes.

A step's tokens from all requests are concatenated into one flat batch of ``T`` tokens. Each
sequence ``s`` owns query rows ``query_start_loc[s]:query_start_loc[s+1]``; its KV lives in 16-token
blocks listed in ``block_tables[s]`` (vLLM PagedAttention, Kwon et al. 2023).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_SIZE = 16
"""Tokens per KV-cache block."""


@dataclass
class ForwardBatch:
    """Attention metadata of one forward over a flat token batch.

    Attributes:
        positions: int64 ``[T]`` rotary position of every token.
        slot_mapping: int64 ``[T]`` cache slot (``block * 16 + row``) each token's K/V is written to.
        block_tables: int32 ``[S, max_blocks]`` physical block ids per sequence.
        seq_lens: int32 ``[S]`` tokens in the cache per sequence after this step's writes.
        query_start_loc: int32 ``[S + 1]`` cumulative query counts.
        max_seq_len: host int, ``max(seq_lens)`` (avoids a device sync).
        max_query_len: host int, the longest query run of the batch.
        seq_lens_host: the same lengths as ``seq_lens`` as host ints, when the step built them on the host
            (the engine's eager steps; ``None`` in a replayed CUDA graph, whose lengths live on the device):
            the GPU decode kernel sizes its split-KV from them (``kernels/paged_decode_config.py``).
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_seq_len: int
    max_query_len: int
    seq_lens_host: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @classmethod
    def contiguous(
        cls, q_lens: list[int], ctx_lens: list[int], device: torch.device | str = "cpu", first_block: int = 0
    ) -> ForwardBatch:
        """Metadata for sequences whose blocks are laid out back to back from ``first_block``.

        Sequence ``s`` has ``ctx_lens[s]`` tokens already cached and ``q_lens[s]`` new tokens; it owns
        ``ceil((ctx + q) / 16)`` consecutive blocks. Used by the sequential references and the
        code predictor's per-frame scratch cache, never by the serving engine.
        """
        positions, slots, tables = [], [], []
        block = first_block
        totals = [c + q for c, q in zip(ctx_lens, q_lens)]
        width = max(1, max(-(-t // BLOCK_SIZE) for t in totals))
        for ctx, total in zip(ctx_lens, totals):
            nblk = -(-total // BLOCK_SIZE)
            ids = list(range(block, block + nblk))
            tables.append(ids + [0] * (width - nblk))
            pos = list(range(ctx, total))
            positions += pos
            slots += [ids[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in pos]
            block += nblk
        qsl = [0]
        for q in q_lens:
            qsl.append(qsl[-1] + q)
        return cls(
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(totals, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
            max_seq_len=max(totals),
            max_query_len=max(q_lens),
        )


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(k_cache, v_cache)``, each ``[num_blocks, 16, num_kv_heads, head_dim]`` zeros."""
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]


class SequenceCache:
    """One sequence's contiguous paged KV cache, for the sequential references (not the engine).

    Args:
        cfg: the decoder's :class:`~.config.DecoderConfig` (layers, KV heads, head dim).
        capacity: most tokens the sequence will hold.
    """

    def __init__(
        self, cfg, capacity: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> None:
        self.kv = allocate_kv_cache(
            cfg.num_hidden_layers,
            -(-capacity // BLOCK_SIZE),
            cfg.num_key_value_heads,
            cfg.head_dim,
            dtype=dtype,
            device=device,
        )
        self.len = 0

    def batch(self, n: int) -> ForwardBatch:
        """Metadata for appending ``n`` tokens; advances the length."""
        b = ForwardBatch.contiguous([n], [self.len], device=self.kv[0][0].device)
        self.len += n
        return b
