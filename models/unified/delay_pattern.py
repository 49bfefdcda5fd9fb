"""The MusicGen delay pattern (Copet et al. 2023, "Simple and Controllable Music Generation", §2.2).

``S`` codebook streams are predicted in parallel, stream ``i`` delayed by ``i`` frames: at delayed step
``a`` stream ``i`` carries frame ``a − i``. A clip of ``F`` frames therefore takes ``F + S − 1`` steps;
stream ``i`` holds pad for its first ``i`` steps (delay) and its last ``S − 1 − i`` steps (drain). The
same layout is used on the model's input (the tokens of step ``a`` are embedded and summed) and on its
output (step ``a``'s logits predict step ``a + 1``'s tokens), as in OpusLM's delay-interleaved
multi-stream LM (Tian et al. 2025, built on ESPnet-SpeechLM's ``ARDelayLM``).

Pure tensor functions, no model state. ``pad`` may be one id for every stream or one id per stream
(the flat vocabulary of :mod:`.unified` gives each stream its own pad id).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _pad_column(pad: int | Sequence[int] | torch.Tensor, s: int, like: torch.Tensor) -> torch.Tensor:
    """``pad`` as an int64 ``[S, 1]`` column on ``like``'s device."""
    p = torch.as_tensor(pad, dtype=like.dtype, device=like.device).reshape(-1)
    if p.numel() == 1:
        p = p.expand(s)
    if p.numel() != s:
        raise ValueError(f"got {p.numel()} pad ids for {s} streams")
    return p.reshape(s, 1)


def interleave(codes: torch.Tensor, pad: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Delay ``codes`` ``[..., S, F]`` into ``[..., S, F + S − 1]``: stream ``i`` shifted right by ``i``.

    Entry ``[i, a]`` is ``codes[i, a − i]`` when ``0 <= a − i < F``, else ``pad`` (or ``pad[i]``).
    Keeps the dtype and device of ``codes``.

    Raises:
        ValueError: ``codes`` has fewer than 2 dims, or ``pad`` is a sequence whose length is not ``S``.
    """
    if codes.dim() < 2:
        raise ValueError(f"codes must be [..., S, F], got shape {list(codes.shape)}")
    s, f = codes.shape[-2], codes.shape[-1]
    out = _pad_column(pad, s, codes).expand(*codes.shape[:-1], f + s - 1).clone()
    for i in range(s):
        out[..., i, i : i + f] = codes[..., i, :]
    return out


def deinterleave(delayed: torch.Tensor) -> torch.Tensor:
    """Undo :func:`interleave`: ``[..., S, A]`` → ``[..., S, A − S + 1]``, ``out[i, f] = delayed[i, f + i]``.

    Raises:
        ValueError: ``A < S − 1`` (fewer steps than the delay itself).
    """
    s, a = delayed.shape[-2], delayed.shape[-1]
    f = a - s + 1
    if f < 0:
        raise ValueError(f"{a} delayed steps cannot hold {s} streams (need at least {s - 1})")
    return torch.stack([delayed[..., i, i : i + f] for i in range(s)], dim=-2)


def step_validity(
    step: int | torch.Tensor, num_streams: int, num_frames: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Which streams carry a real code at delayed step ``step``: bool ``[..., S]``.

    Stream ``i`` is real iff ``i <= step`` and ``step − i < num_frames`` (``num_frames=None``: the clip's
    length is not known yet, i.e. the audio phase is still running, so only the leading delay is pad).
    ``step`` and ``num_frames`` broadcast (int64 ``[B]`` tensors give ``[B, S]``).
    """
    step = torch.as_tensor(step, dtype=torch.int64)
    i = torch.arange(num_streams, dtype=torch.int64, device=step.device)
    valid = i <= step[..., None]
    if num_frames is not None:
        nf = torch.as_tensor(num_frames, dtype=torch.int64, device=step.device)
        valid = valid & (step[..., None] - i < nf[..., None])
    return valid


def validity_mask(num_frames: int, num_streams: int) -> torch.Tensor:
    """bool ``[S, F + S − 1]``: ``True`` where :func:`interleave` places a real code (not a pad)."""
    steps = torch.arange(num_frames + num_streams - 1)
    return step_validity(steps, num_streams, num_frames).T.contiguous()


def completed_frames(num_steps: int | torch.Tensor, num_streams: int, num_frames=None):
    """Frames whose ``S`` codes have all been emitted after ``num_steps`` delayed steps.

    Frame ``f`` is complete once step ``f + S − 1`` is out, so this is ``max(0, num_steps − S + 1)``,
    capped at ``num_frames`` when known. Works on ints or int64 tensors.
    """
    if isinstance(num_steps, torch.Tensor):
        done = (num_steps - num_streams + 1).clamp(min=0)
        return done if num_frames is None else torch.minimum(done, torch.as_tensor(num_frames))
    done = max(0, num_steps - num_streams + 1)
    return done if num_frames is None else min(done, num_frames)
