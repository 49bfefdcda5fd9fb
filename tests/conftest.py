"""Test-session setup. Triton's interpreter must be chosen before triton is first imported (by anyone)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Engines keep the intra-op thread count the test set: on a shared host the thread governor would follow
# other processes' load, and a changed thread count may change float rounding between runs a test compares.
os.environ.setdefault("OMNIDUPLEX_ADAPT_THREADS", "0")
