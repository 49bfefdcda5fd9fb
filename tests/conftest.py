"""Test-session setup. Triton's interpreter must be chosen before triton is first imported (by anyone)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
