"""Plain-torch paged attention: the reference for the Triton kernels and the production path on CPU.

Paged KV cache layout (the contract shared with ``models/`` and ``pipeline/engine``; vLLM PagedAttention,
Kwon et al. 2023, arXiv:2309.06180):

- per layer ``k_cache``, ``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (block_size 16);
- ``block_tables``: int32 ``[num_seqs, max_blocks_per_seq]``; logical position ``p`` of sequence ``s``
  lives in block ``block_tables[s, p // block_size]``, row ``p % block_size``; unused entries may hold
  any value;
- ``seq_lens``: int32 ``[num_seqs]``, tokens in the cache for each sequence *including* this step's
  (already written) tokens;
- flat query batch ``q``: ``[num_tokens, num_q_heads, head_dim]`` with ``query_start_loc`` int32
  ``[num_seqs + 1]``; the ``i``-th of the ``q_len`` queries of sequence ``s`` sits at position
  ``seq_lens[s] - q_len + i`` and attends causally to positions ``0..`` that position;
- GQA: query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)``.

The attention itself is ``torch.nn.functional.scaled_dot_product_attention`` on a padded batch. Its CPU
kernels (flash and math) accumulate bf16/fp16 inputs in fp32 (``at::opmath_type``), so no up-cast is
made here; the output has the dtype of ``q``.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F

from omniduplex.kernels.paged_shapes import check_attention_heads, check_kv_write

__all__ = ["paged_attention_torch", "write_kv_cache"]


def write_kv_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write this step's keys and values into the paged cache, in place.

    Args:
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, any float dtype.
        k, v: ``[num_tokens, num_kv_heads, head_dim]``; cast to the cache dtype if they differ.
        slot_mapping: int64 (int32 accepted) ``[num_tokens]``, ``slot = block_id * block_size + row``, or
            ``-1``: the token writes nothing (vLLM's ``PAD_SLOT_ID``: the padding rows of a batch replayed
            as a CUDA graph of a larger bucket). Any other slot must be a valid index
            (``0 <= slot < num_blocks * block_size``). Duplicate slots leave an unspecified one of the
            written rows.

    On the CPU the skipped rows are dropped before the write (a host check is free there); elsewhere the
    write has no host sync (it may be captured in a CUDA graph): a skipped row is written to the slot of the
    batch's first written row with that row's own values, so every slot still receives one value, and
    when no row is written, slot 0 receives what it holds.

    Raises:
        ValueError: on mismatched shapes.
        RuntimeError: (from ``view``) if the cache is not contiguous over its first two dimensions.
    """
    num_blocks, block_size, num_kv_heads, head_dim = check_kv_write(k_cache, v_cache, k, v, slot_mapping)
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    flat = (num_blocks * block_size, num_kv_heads, head_dim)
    k_flat, v_flat = k_cache.view(flat), v_cache.view(flat)
    if slots.device.type != "cpu":
        _write_skipping(k_flat, v_flat, k, v, slots)
        return
    if slots.numel() and int(slots.min()) < 0:
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    k_flat.index_copy_(0, slots, k.to(k_cache.dtype))
    v_flat.index_copy_(0, slots, v.to(v_cache.dtype))


def _write_skipping(
    k_flat: torch.Tensor, v_flat: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
) -> None:
    """The write of :func:`write_kv_cache` with ``-1`` slots and no host sync (see its docstring)."""
    t = slots.shape[0]
    if t == 0:
        return
    valid = slots >= 0
    first = torch.argmax(valid.to(torch.int32))  # the first written row (0 when there is none)
    rows = torch.where(valid, torch.arange(t, device=slots.device), first)
    target = slots[rows]  # -1 only when no row is written at all
    written = (target >= 0)[:, None, None]
    target = target.clamp(min=0)
    for cache, src in ((k_flat, k), (v_flat, v)):
        value = torch.where(written, src[rows].to(cache.dtype), cache[target])
        cache.index_copy_(0, target, value)


def _gather_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather each sequence's cached K/V into padded ``[S, Hkv, max_len, D]`` views (token-level gather).

    Positions ``>= seq_lens[s]`` are filled with the row at position 0 of the same sequence rather than
    whatever the block holds, so unwritten cache rows (possibly NaN after ``torch.empty``) and garbage
    block-table entries are never read. Returns ``(k, v, valid)`` with ``valid`` bool ``[S, max_len]``.
    """
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    num_seqs = block_tables.shape[0]
    device = block_tables.device
    n_blk = min(-(-max_len // block_size), block_tables.shape[1])
    base = block_tables[:, :n_blk].long().clamp_(0, num_blocks - 1) * block_size  # [S, n_blk]
    rows = torch.arange(block_size, device=device)
    length = min(max_len, n_blk * block_size)
    slots = (base[:, :, None] + rows).view(num_seqs, n_blk * block_size)[:, :length]  # [S, L]
    valid = torch.arange(length, device=device) < seq_lens[:, None]  # [S, L]
    slots = torch.where(valid, slots, slots[:, :1]).reshape(-1)
    flat = (num_blocks * block_size, num_kv_heads * head_dim)
    rows = (slots.shape[0], num_kv_heads * head_dim)
    shape = (num_seqs, length, num_kv_heads, head_dim)
    k = torch.index_select(k_cache.view(flat), 0, slots, out=_scratch("k", rows, k_cache))
    v = torch.index_select(v_cache.view(flat), 0, slots, out=_scratch("v", rows, v_cache))
    return k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2), valid


_workspace = threading.local()


def _scratch(name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A per-thread reusable CPU buffer of ``shape`` (dtype/device of ``like``), contents undefined.

    A fresh multi-MB tensor per call costs more in first-touch page faults than the gather that fills it
    (~4x slower on this VM), so the gathered K/V live in a buffer that grows by 25% steps and is reused
    by every layer and step of the thread. Used only on CPU without autograd; elsewhere a new tensor.
    """
    if like.device.type != "cpu" or (like.requires_grad and torch.is_grad_enabled()):
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    numel = math.prod(shape)
    buffers = _workspace.__dict__.setdefault("buffers", {})
    buf = buffers.get((name, like.dtype))
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor works in and out of inference mode
            buf = buffers[(name, like.dtype)] = torch.empty(numel + numel // 4, dtype=like.dtype)
    return buf[:numel].view(shape)


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_len: int,
) -> torch.Tensor:
    """One query per sequence: ``q [S, Hq, D]`` -> ``[S, Hq, D]``.

    GQA is handled by folding the query heads of a group into the query-length axis (``[S, Hkv, G, D]``)
    so K/V are neither expanded nor broadcast; on CPU this is ~2x faster than ``enable_gqa=True``.
    """
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    k, v, valid = _gather_kv(k_cache, v_cache, block_tables, seq_lens, max_len)
    q_folded = q.reshape(num_seqs, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(q_folded, k, v, attn_mask=valid[:, None, None, :], scale=scale)
    return out.reshape(num_seqs, num_q_heads, head_dim)


def _padded_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_lens: torch.Tensor,
    tok_seq: torch.Tensor,
    tok_local: torch.Tensor,
    scale: float,
    max_len: int,
    max_q: int,
) -> torch.Tensor:
    """Varlen causal attention for ``q [T, Hq, D]`` whose token ``t`` is query ``tok_local[t]`` of
    sequence ``tok_seq[t]``: queries are scattered into ``[S, max_q, Hq, D]``, attended with a
    causal+length mask, and gathered back to ``[T, Hq, D]``."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    k, v, _ = _gather_kv(k_cache, v_cache, block_tables, seq_lens, max_len)
    q_pad = q.new_zeros(num_seqs, max_q, num_q_heads, head_dim)
    q_pad[tok_seq, tok_local] = q
    # Padded query rows are pinned to the last position so that no mask row is empty (no NaN).
    q_pos = (seq_lens - q_lens)[:, None] + torch.arange(max_q, device=q.device)
    q_pos = torch.minimum(q_pos, (seq_lens - 1)[:, None])  # [S, max_q]
    mask = torch.arange(k.shape[2], device=q.device) <= q_pos[:, :, None]  # [S, max_q, L]
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2),
        k,
        v,
        attn_mask=mask[:, None],
        scale=scale,
        enable_gqa=num_q_heads != num_kv_heads,
    )  # [S, Hq, max_q, D]
    return out.transpose(1, 2)[tok_seq, tok_local]


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_seq_len: int | None = None,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Causal varlen attention of a flat query batch over the paged KV cache (prefill chunks, decodes, or
    both in one batch), with no Python loop over sequences.

    Args:
        q: ``[num_tokens, num_q_heads, head_dim]``, fp32/bf16/fp16.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same dtype as ``q``,
            contiguous over the last three dimensions.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``.
        seq_lens: int32 ``[num_seqs]``, cached tokens including this step's; ``>= q_len`` of each sequence.
        query_start_loc: int32 ``[num_seqs + 1]``, cumulative query counts, ``query_start_loc[-1] ==
            num_tokens``.
        scale: softmax scale, usually ``head_dim ** -0.5``.
        max_seq_len, max_query_len: optional host-side upper bounds of ``seq_lens`` and of the query
            lengths; when given they avoid a device-to-host sync (on CPU the sync is free).

    Returns:
        ``[num_tokens, num_q_heads, head_dim]`` in the dtype of ``q``.

    Decode-only batches (every query length 1) take a fast path with GQA folded into the query axis.
    Mixed batches are split (one host sync) into the decode sequences and the rest, so decodes do not pay
    for the padding of a long prefill chunk. Sequences with ``seq_len == 0`` must have no queries.

    Raises:
        ValueError: on inconsistent shapes or ``num_q_heads`` not a multiple of ``num_kv_heads``.
    """
    check_attention_heads(q, k_cache, v_cache)
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"query_start_loc {tuple(query_start_loc.shape)} / block_tables {tuple(block_tables.shape)} "
            f"do not match num_seqs={num_seqs}"
        )
    if num_tokens == 0 or num_seqs == 0:
        return q.new_zeros(q.shape)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len == 1 and num_tokens == num_seqs:
        return _decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len)

    device = q.device
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    is_decode = q_lens == 1
    num_decode = int(is_decode.sum())  # host sync; mixed batches only
    if num_decode == num_seqs and num_tokens == num_seqs:
        return _decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len)
    if 0 < num_decode < num_seqs:
        out = torch.empty_like(q)
        dec = is_decode.nonzero().squeeze(1)
        dec_tok = query_start_loc[dec].long()
        out[dec_tok] = _decode_attention(
            q[dec_tok], k_cache, v_cache, block_tables[dec], seq_lens[dec], scale, max_seq_len
        )
        rest = (~is_decode).nonzero().squeeze(1)
        rest_q_lens = q_lens[rest]
        rest_tokens = num_tokens - num_decode
        tok_seq = torch.repeat_interleave(
            torch.arange(rest.shape[0], device=device), rest_q_lens, output_size=rest_tokens
        )
        rest_start = torch.cumsum(rest_q_lens, 0) - rest_q_lens  # start of each sequence, compacted
        tok_local = torch.arange(rest_tokens, device=device) - rest_start[tok_seq]
        rest_tok = query_start_loc[rest].long()[tok_seq] + tok_local
        out[rest_tok] = _padded_attention(
            q[rest_tok],
            k_cache,
            v_cache,
            block_tables[rest],
            seq_lens[rest],
            rest_q_lens,
            tok_seq,
            tok_local,
            scale,
            max_seq_len,
            max_query_len,
        )
        return out
    tok_seq = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens, output_size=num_tokens)
    tok_local = torch.arange(num_tokens, device=device) - query_start_loc[tok_seq].long()
    return _padded_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        q_lens,
        tok_seq,
        tok_local,
        scale,
        max_seq_len,
        max_query_len,
    )
