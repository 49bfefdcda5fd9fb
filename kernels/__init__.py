"""Attention kernels over the paged KV cache: Triton kernels, plain-torch references, and a dispatcher.

The package imports without Triton installed: ``paged_attention`` then runs the torch path and
``paged_decode_attention_triton`` raises ``RuntimeError`` when called.
"""

from omniduplex.kernels import custom_ops
from omniduplex.kernels.attention import BACKEND_ENV, paged_attention, select_backend, write_kv_cache
from omniduplex.kernels.paged_attention_ref import paged_attention_torch
from omniduplex.kernels.paged_decode_attention import (
    HAS_TRITON,
    choose_num_splits,
    paged_decode_attention_triton,
)

__all__ = [
    "custom_ops",
    "BACKEND_ENV",
    "HAS_TRITON",
    "choose_num_splits",
    "paged_attention",
    "paged_attention_torch",
    "paged_decode_attention_triton",
    "select_backend",
    "write_kv_cache",
]
