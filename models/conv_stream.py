"""Streaming 1-D convolution stacks with per-layer state: each input sample is processed once.

A stream object wraps a layer of a vocoder (weights shared, not copied) and keeps what a later output
still needs: a conv's last ``(k−1)·dilation`` inputs (its halo), a transposed conv's overlap-add tail,
a residual unit's skip path delayed by its branch's latency. ``push(x)`` (``[B, C, n]``, any ``n >= 0``)
returns every output sample that no later input can change; ``flush()`` feeds the right padding of the
one-shot layer and returns the rest. Concatenating the outputs of any split of the input into pushes,
plus the flush, equals the one-shot layer output (to float rounding). Used by :mod:`.dac_stream`
(centred convs: output waits for the look-ahead) and :mod:`.code2wav_stream` (causal convs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class ConvStream:
    """Stride-1 ``conv`` with ``left`` zeros of padding before the signal and ``right`` after it.

    Centred (DAC): ``left = right = padding``; causal: ``left = (k−1)·dilation``, ``right = 0``.
    """

    def __init__(self, conv: nn.Conv1d, left: int, right: int, batch: int) -> None:
        w = conv.weight
        self.conv, self.right = conv, right
        self.halo = (conv.kernel_size[0] - 1) * conv.dilation[0]
        self.buf = w.new_zeros(batch, conv.in_channels, left)

    def push(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.cat([self.buf, x], dim=-1)
        n = buf.shape[-1] - self.halo
        if n <= 0:
            self.buf = buf
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0)
        self.buf = buf[..., n:]
        c = self.conv
        return F.conv1d(buf, c.weight, c.bias, dilation=c.dilation, groups=c.groups)

    def flush(self) -> torch.Tensor:
        return self.push(self.buf.new_zeros(*self.buf.shape[:2], self.right))


class ConvTransposeStream:
    """``ConvTranspose1d`` (kernel ``K``, stride ``s``) by overlap-add, ``crop_left``/``crop_right`` output
    samples dropped at the ends (``padding`` for ``nn.ConvTranspose1d``, ``K − s`` for a trimmed one).

    Input ``i`` writes outputs ``[i·s, i·s + K)``, so after a push every sample before the next input's
    first output is final; the last ``K − s`` wait in ``tail``.
    """

    def __init__(self, conv: nn.ConvTranspose1d, crop_left: int, crop_right: int, batch: int) -> None:
        self.conv, self.stride = conv, conv.stride[0]
        self.crop, self.crop_right = crop_left, crop_right  # ``crop``: samples still to drop at the start
        self.tail = conv.weight.new_zeros(batch, conv.out_channels, conv.kernel_size[0] - self.stride)

    def _emit(self, y: torch.Tensor) -> torch.Tensor:
        if self.crop:
            cut = min(self.crop, y.shape[-1])
            y, self.crop = y[..., cut:], self.crop - cut
        return y + self.conv.bias[:, None] if self.conv.bias is not None else y

    def push(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        if n == 0:
            return self.tail[..., :0]
        z = F.conv_transpose1d(x, self.conv.weight, None, stride=self.stride)  # [B, C, (n−1)·s + K]
        z[..., : self.tail.shape[-1]] += self.tail
        ready = n * self.stride
        self.tail = z[..., ready:]
        return self._emit(z[..., :ready])

    def flush(self) -> torch.Tensor:
        return self._emit(self.tail[..., : max(0, self.tail.shape[-1] - self.crop_right)])


class Pointwise:
    """A per-sample, channel-preserving map (activation, C→C 1×1 conv, clamp): no state, nothing to flush."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.fn = fn

    def push(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) if x.shape[-1] else x

    def flush(self) -> None:
        return None


class Chain:
    """Streams in series; a flush pushes each part's flushed tail into the next part, then flushes it."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def push(self, x: torch.Tensor) -> torch.Tensor:
        for p in self.parts:
            x = p.push(x)
        return x

    def flush(self) -> torch.Tensor | None:
        x = None
        for p in self.parts:
            y = p.push(x) if x is not None else None
            tail = p.flush()
            x = y if tail is None else (tail if y is None else torch.cat([y, tail], dim=-1))
        return x


class Residual:
    """``x + branch(x)``; the skip path waits in ``skip`` for the branch's latency (0 when causal)."""

    def __init__(self, branch: Chain, channels: int, like: torch.Tensor, batch: int) -> None:
        self.branch = branch
        self.skip = like.new_zeros(batch, channels, 0)

    def _add(self, y: torch.Tensor | None) -> torch.Tensor:
        if y is None:
            return self.skip[..., :0]
        m = y.shape[-1]
        out = self.skip[..., :m] + y
        self.skip = self.skip[..., m:]
        return out

    def push(self, x: torch.Tensor) -> torch.Tensor:
        self.skip = torch.cat([self.skip, x], dim=-1)
        return self._add(self.branch.push(x))

    def flush(self) -> torch.Tensor:
        return self._add(self.branch.flush())


class OneShotEnd:
    """The end of a decoder stream: pushes until one ``flush``, then ValueError on any further call."""

    done = False

    def check_open(self, op: str) -> None:
        if self.done:
            raise ValueError(f"{op} after flush: the stream has ended")

    def close(self) -> None:
        self.check_open("flush")
        self.done = True


def state_tensors(stream) -> list[torch.Tensor]:
    """The tensors a conv-side stream carries between pushes, in a fixed order (halos of :class:`ConvStream`,
    tails of :class:`ConvTransposeStream`, skips of :class:`Residual`, through :class:`Chain`): what a caller
    must save and restore to replay a push on other buffers (CUDA graphs). Their shapes do not change from
    push to push."""
    if isinstance(stream, ConvStream):
        return [stream.buf]
    if isinstance(stream, ConvTransposeStream):
        return [stream.tail]
    if isinstance(stream, Residual):
        return [stream.skip, *state_tensors(stream.branch)]
    if isinstance(stream, Chain):
        return [t for part in stream.parts for t in state_tensors(part)]
    return []


def load_state(stream, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Set the state of ``stream`` to the first tensors of ``tensors`` (the order of :func:`state_tensors`);
    returns the rest."""
    if isinstance(stream, ConvStream):
        stream.buf = tensors[0]
        return tensors[1:]
    if isinstance(stream, ConvTransposeStream):
        stream.tail = tensors[0]
        return tensors[1:]
    if isinstance(stream, Residual):
        stream.skip = tensors[0]
        return load_state(stream.branch, tensors[1:])
    if isinstance(stream, Chain):
        for part in stream.parts:
            tensors = load_state(part, tensors)
    return tensors


def cropping(stream) -> bool:
    """Whether a transposed conv of ``stream`` still drops output samples (before its first output): a push
    then has host-side state (the crop counter) besides its tensors."""
    if isinstance(stream, ConvTransposeStream):
        return stream.crop > 0
    if isinstance(stream, Residual):
        return cropping(stream.branch)
    if isinstance(stream, Chain):
        return any(cropping(part) for part in stream.parts)
    return False


def stack_states(parts: list, into) -> None:
    """Set ``into`` (a stream built for ``len(parts)`` rows) to the states of ``parts`` (single-row streams
    of the same structure) stacked along the batch: several streams then advance in one batched push.

    Raises ValueError when the states cannot stack (a transposed conv still cropping in some rows only),
    TypeError for a part with no stacking."""
    if isinstance(into, ConvStream):
        into.buf = torch.cat([p.buf for p in parts])
    elif isinstance(into, ConvTransposeStream):
        if len({p.crop for p in parts}) != 1:
            raise ValueError("streams at different transposed-conv crops cannot stack")
        into.tail, into.crop = torch.cat([p.tail for p in parts]), parts[0].crop
    elif isinstance(into, Residual):
        into.skip = torch.cat([p.skip for p in parts])
        stack_states([p.branch for p in parts], into.branch)
    elif isinstance(into, Chain):
        for i, sub in enumerate(into.parts):
            stack_states([p.parts[i] for p in parts], sub)
    elif not isinstance(into, Pointwise):
        raise TypeError(f"no stacking for {type(into).__name__}")


def unstack_states(stacked, parts: list) -> None:
    """Give each of ``parts`` its row of ``stacked``'s state (the inverse of :func:`stack_states`)."""
    if isinstance(stacked, ConvStream):
        for b, p in enumerate(parts):
            p.buf = stacked.buf[b : b + 1]
    elif isinstance(stacked, ConvTransposeStream):
        for b, p in enumerate(parts):
            p.tail, p.crop = stacked.tail[b : b + 1], stacked.crop
    elif isinstance(stacked, Residual):
        for b, p in enumerate(parts):
            p.skip = stacked.skip[b : b + 1]
        unstack_states(stacked.branch, [p.branch for p in parts])
    elif isinstance(stacked, Chain):
        for i, sub in enumerate(stacked.parts):
            unstack_states(sub, [p.parts[i] for p in parts])


def check_batch_rows(streams: list, decoder_of: str, codes: torch.Tensor, what: str) -> None:
    """Raise ``ValueError`` (naming ``what``) for single-row streams that cannot be decoded as one batch:
    none, a closed one, a stream with ``batch != 1`` or of another decoder than the first stream's (the
    attribute named ``decoder_of``), one stream twice, bad codes (the decoder's ``check_codes``), or
    ``codes`` int64 ``[B, Q, n]`` with ``B != len(streams)``. Checks only: nothing is changed."""
    if not streams:
        raise ValueError(f"{what}: no streams")
    decoder = getattr(streams[0], decoder_of)
    for s in streams:
        s.check_open("push")
        if s.batch != 1 or getattr(s, decoder_of) is not decoder:
            raise ValueError(f"{what}: streams must be single-row streams of one decoder")
    if len({id(s) for s in streams}) != len(streams):
        raise ValueError(f"{what}: a stream appears twice")
    decoder.check_codes(codes)
    if codes.shape[0] != len(streams):
        raise ValueError(f"{what}: codes must be [{len(streams)}, Q, n], got {list(codes.shape)}")
