"""Test-session setup. Triton's interpreter must be chosen before triton is first imported (by anyone)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One intra-op thread, as every stage process runs by default (StageConfig.torch_threads = 1): an engine's
# thread governor then has nothing to adapt (pipeline/engine/threads.py), so float rounding does not change
# between runs a test compares. Nothing here switches a production code path.
torch.set_num_threads(1)
