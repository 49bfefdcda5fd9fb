"""Argument checks the paged-KV kernels share (the torch reference, the Triton launchers).

Layout (vLLM's paged KV cache): caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, a token's
keys / values ``[num_tokens, num_kv_heads, head_dim]``, queries ``[num_tokens, num_q_heads, head_dim]``.
"""

from __future__ import annotations

import torch


def check_kv_write(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> tuple[int, int, int, int]:
    """The cache shape ``(num_blocks, block_size, num_kv_heads, head_dim)`` of a KV write of ``k`` / ``v``
    ``[num_tokens, num_kv_heads, head_dim]`` at ``slot_mapping [num_tokens]``.

    Raises:
        ValueError: the two caches differ in shape, or ``k`` / ``v`` do not match the slots and the cache.
    """
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    expected = (slot_mapping.shape[0], num_kv_heads, head_dim)
    if tuple(k.shape) != expected or tuple(v.shape) != expected:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} must be {expected}")
    return num_blocks, block_size, num_kv_heads, head_dim


def check_attention_heads(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Check that ``q [num_tokens, num_q_heads, head_dim]`` attends over caches of its ``head_dim`` whose
    ``num_kv_heads`` divides ``num_q_heads`` (GQA), and that the two caches share one shape.

    Raises:
        ValueError: naming the three shapes when they do not fit.
    """
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, kv_dim = k_cache.shape[2], k_cache.shape[3]
    if kv_dim != head_dim or num_q_heads % num_kv_heads or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"incompatible shapes: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
            f"v_cache {tuple(v_cache.shape)}"
        )
