"""Streaming state for batched sessions: every streaming module keeps per-row buffers sized for a capacity of
rows; a step over ``B`` rows uses rows ``[:B]`` in place. Sessions stay compact (rows ``0..B-1``): a leaving
session's row is overwritten by the last one (:func:`move_row`), a joining one gets its row zeroed
(:func:`reset_rows`). Without streaming a module builds a fresh state for the call (one-shot).

The causal convolutions follow Mimi's (``moshi/modules/conv.py``, arXiv 2410.00037 §3.3): a conv of stride
``S`` and effective kernel ``K`` keeps the last ``K - S`` input samples; a transposed conv keeps the
``K - S`` overlapping output samples (bias removed) and adds them to the next call's head.
"""

from __future__ import annotations

import torch
from torch import nn


class Streaming(nn.Module):
    """A module with per-row streaming buffers in ``self.state`` (``None`` when not streaming)."""

    def __init__(self) -> None:
        super().__init__()
        self.state: dict[str, torch.Tensor] | None = None

    def new_state(self, rows: int) -> dict[str, torch.Tensor]:
        """Fresh buffers for ``rows`` rows (zeros unless a subclass says otherwise)."""
        raise NotImplementedError

    def fresh_row_values(self) -> dict[str, float]:
        """Value a reset row takes per buffer (default 0)."""
        return {}

    def rows(self, batch: int) -> dict[str, torch.Tensor]:
        """The state for a call over ``batch`` rows: rows ``[:batch]`` of the streaming buffers, or new
        ones."""
        if self.state is None:
            return self.new_state(batch)
        if batch > next(iter(self.state.values())).shape[0]:
            raise ValueError(f"batch {batch} exceeds the streaming capacity")
        return {k: v[:batch] for k, v in self.state.items()}


def start_streaming(model: nn.Module, capacity: int) -> None:
    """Allocate every streaming buffer of ``model`` for ``capacity`` rows (all rows fresh)."""
    for m in model.modules():
        if isinstance(m, Streaming):
            m.state = m.new_state(capacity)


def stop_streaming(model: nn.Module) -> None:
    """Drop every streaming buffer (back to one-shot calls)."""
    for m in model.modules():
        if isinstance(m, Streaming):
            m.state = None


def reset_rows(model: nn.Module, rows: torch.Tensor) -> None:
    """Make ``rows`` (int64 ``[n]``) fresh in every streaming buffer (a session joins)."""
    for m in model.modules():
        if isinstance(m, Streaming) and m.state is not None:
            fresh = m.fresh_row_values()
            for k, v in m.state.items():
                v[rows] = fresh.get(k, 0)


def move_row(model: nn.Module, src: int, dst: int) -> None:
    """Copy row ``src`` onto ``dst`` in every streaming buffer (compaction when a session leaves)."""
    for m in model.modules():
        if isinstance(m, Streaming) and m.state is not None:
            for v in m.state.values():
                v[dst] = v[src]


class _Conv(nn.Module):
    def __init__(self, conv: nn.Module, attr: str) -> None:
        super().__init__()
        setattr(self, attr, conv)


class StreamingConv1d(Streaming):
    """Causal ``nn.Conv1d`` (``conv.conv.weight`` as published). ``x`` ``[B, C_in, T]`` → ``[B, C_out, T /
    S]``.

    ``pad_mode="replicate"`` fills the first call's left context with the first sample (Mimi's downsampling);
    ``"constant"`` with zeros."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ) -> None:
        super().__init__()
        self.conv = _Conv(
            nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, groups=groups, bias=bias), "conv"
        )
        self.c_in, self.stride, self.pad_mode = c_in, stride, pad_mode
        self.context = (kernel - 1) * dilation + 1 - stride

    def new_state(self, rows: int) -> dict[str, torch.Tensor]:
        w = self.conv.conv.weight
        return {
            "previous": torch.zeros(rows, self.c_in, self.context, dtype=w.dtype, device=w.device),
            "first": torch.ones(rows, dtype=torch.bool, device=w.device),
        }

    def fresh_row_values(self) -> dict[str, float]:
        return {"first": True}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = self.rows(x.shape[0])
        tp = self.context
        if tp:
            prev = st["previous"]
            if self.pad_mode == "replicate":
                prev = torch.where(st["first"].view(-1, 1, 1), x[..., :1], prev)
            x = torch.cat([prev, x], dim=-1)
        y = self.conv.conv(x)
        if tp:
            st["previous"].copy_(x[..., -tp:])
            st["first"].fill_(False)
        return y


class StreamingConvTranspose1d(Streaming):
    """Causal ``nn.ConvTranspose1d`` (``convtr.convtr.weight``). ``x`` ``[B, C_in, T]`` → ``[B, C_out, T·S]``;
    one-shot calls trim the ``K - S`` trailing samples, streaming calls carry them to the next call."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, stride: int, groups: int = 1, bias: bool = True
    ) -> None:
        super().__init__()
        self.convtr = _Conv(
            nn.ConvTranspose1d(c_in, c_out, kernel, stride, groups=groups, bias=bias), "convtr"
        )
        self.c_out, self.overlap = c_out, kernel - stride

    def new_state(self, rows: int) -> dict[str, torch.Tensor]:
        w = self.convtr.convtr.weight
        return {"partial": torch.zeros(rows, self.c_out, self.overlap, dtype=w.dtype, device=w.device)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.convtr.convtr(x)
        pt = self.overlap
        if not pt:
            return y
        if self.state is None:
            return y[..., :-pt]
        st = self.rows(x.shape[0])
        y[..., :pt] += st["partial"]
        tail = y[..., -pt:]
        bias = self.convtr.convtr.bias
        if bias is not None:
            tail = tail - bias[:, None]
        st["partial"].copy_(tail)
        return y[..., :-pt]
