"""The MusicGen delay pattern: interleave / de-interleave round trip and per-step validity."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omniduplex.models.unified.delay_pattern import (
    completed_frames,
    deinterleave,
    interleave,
    step_validity,
    validity_mask,
)


@settings(max_examples=60, deadline=None)
@given(
    s=st.integers(1, 9),
    f=st.integers(0, 20),
    batch=st.integers(0, 2),
    seed=st.integers(0, 2**31 - 1),
    per_stream_pad=st.booleans(),
)
def test_round_trip_and_layout(s, f, batch, seed, per_stream_pad):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, s, f) if batch else (s, f)
    codes = torch.randint(0, 50, shape, generator=g)
    pads = list(range(100, 100 + s)) if per_stream_pad else -7
    delayed = interleave(codes, pads)
    assert delayed.shape == (*shape[:-1], f + s - 1)
    assert torch.equal(deinterleave(delayed), codes)
    valid = validity_mask(f, s)
    pad_grid = torch.tensor(pads).reshape(-1, 1).expand(s, f + s - 1) if per_stream_pad else -7
    for i in range(s):
        for a in range(f + s - 1):
            want = codes[..., i, a - i] if valid[i, a] else (pad_grid[i, a] if per_stream_pad else -7)
            assert torch.all(delayed[..., i, a] == want)
    # validity: stream i real iff i <= a < f + i, i.e. exactly f real entries per stream
    assert valid.sum(dim=1).tolist() == [f] * s


def test_worked_example():
    codes = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    delayed = interleave(codes, 0)
    assert delayed.tolist() == [[1, 2, 3, 0, 0], [0, 4, 5, 6, 0], [0, 0, 7, 8, 9]]
    assert validity_mask(3, 3).int().tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]


def test_step_validity_open_ended_and_batched():
    # while the audio phase runs (no known end), only the leading delay is pad
    assert step_validity(1, 4).tolist() == [True, True, False, False]
    steps = torch.tensor([0, 4, 5])
    frames = torch.tensor([2, 3, 3])
    assert step_validity(steps, 4, frames).int().tolist() == [[1, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 1]]


def test_completed_frames():
    assert [completed_frames(n, 4) for n in range(7)] == [0, 0, 0, 0, 1, 2, 3]
    assert completed_frames(9, 4, num_frames=5) == 5
    assert completed_frames(torch.tensor([2, 3, 7]), 4, torch.tensor(3)).tolist() == [0, 0, 3]


def test_errors():
    with pytest.raises(ValueError, match="pad ids"):
        interleave(torch.zeros(3, 2, dtype=torch.int64), [1, 2])
    with pytest.raises(ValueError, match="at least 2"):
        deinterleave(torch.zeros(3, 1, dtype=torch.int64))
