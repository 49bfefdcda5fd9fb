"""Exact streaming DAC decode with per-layer state: each new frame is decoded once.

DAC's decoder convolutions are centred (``models/dac.py``), so the sample at time ``t`` of a layer's
output needs that layer's input up to ``t + padding``. A :class:`DacDecodeStream` keeps, per layer, the
input samples a later output still needs (the conv's ``(k−1)·dilation`` halo), the overlap-add tail of
each ``ConvTranspose1d`` (``kernel − stride`` samples) and, per residual unit, the skip path delayed by
its branch's latency. :meth:`DacDecodeStream.push` decodes only the new frames and returns every sample
that is now final; :meth:`DacDecodeStream.flush` feeds the zero right padding of the one-shot decode and
returns the rest. The concatenated output equals ``DacCodec.decode`` of all frames (float rounding,
~1e-6) for any split into pushes: the latency is the decoder's look-ahead, no frame is decoded twice.

Compared with re-decoding windows with left and right context (:func:`.dac.decode_window`), a chunk of
``n`` frames costs ``n`` frames of work instead of ``n + left + right`` (4× less for 8-frame chunks with
the 12-frame contexts of the 44.1 kHz presets).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .dac import DacCodec, DecoderBlock, ResidualUnit


class _Conv:
    """Stride-1 ``nn.Conv1d`` with symmetric zero padding ``p``, streamed: state = the last inputs that
    outputs not yet emitted still read (starts as the ``p`` zeros of the left padding)."""

    def __init__(self, conv: nn.Conv1d, x: torch.Tensor) -> None:
        self.conv, self.pad = conv, conv.padding[0]
        self.halo = (conv.kernel_size[0] - 1) * conv.dilation[0]
        self.buf = x.new_zeros(x.shape[0], conv.in_channels, self.pad)

    def push(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.cat([self.buf, x], dim=-1)
        n = buf.shape[-1] - self.halo
        if n <= 0:
            self.buf = buf
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0)
        self.buf = buf[..., n:]
        return F.conv1d(buf, self.conv.weight, self.conv.bias, dilation=self.conv.dilation)

    def flush(self) -> torch.Tensor:
        return self.push(self.buf.new_zeros(*self.buf.shape[:2], self.pad))


class _ConvTranspose:
    """``nn.ConvTranspose1d`` (kernel ``K``, stride ``s``, padding ``P``) streamed by overlap-add: input
    frame ``i`` writes output ``[i·s, i·s + K)``, so after a push everything before the next input's
    first output is final; the last ``K − s`` samples wait as ``tail``. ``P`` samples are cropped at each
    end, as the one-shot transposed conv does."""

    def __init__(self, conv: nn.ConvTranspose1d, x: torch.Tensor) -> None:
        self.conv, self.stride = conv, conv.stride[0]
        self.crop = conv.padding[0]  # samples still to drop at the start
        self.tail = x.new_zeros(x.shape[0], conv.out_channels, conv.kernel_size[0] - self.stride)

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
        k = self.tail.shape[-1]
        z[..., :k] += self.tail
        ready = n * self.stride
        self.tail = z[..., ready:]
        return self._emit(z[..., :ready])

    def flush(self) -> torch.Tensor:
        end = self.tail.shape[-1] - self.conv.padding[0]
        return self._emit(self.tail[..., : max(0, end)])


class _Pointwise:
    """A per-sample, channel-preserving module (Snake, C→C 1×1 conv, tanh): no state, nothing to flush."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def push(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) if x.shape[-1] else x

    def flush(self) -> torch.Tensor:
        return None


class _Chain:
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


class _Residual:
    """``x + branch(x)`` where the branch lags its input: the skip path waits in ``skip``."""

    def __init__(self, unit: ResidualUnit, x: torch.Tensor) -> None:
        c = x.new_zeros(x.shape[0], unit.conv1.in_channels, 0)
        conv1, snake2, conv2 = _Conv(unit.conv1, c), _Pointwise(unit.snake2), _Pointwise(unit.conv2)
        self.branch = _Chain([_Pointwise(unit.snake1), conv1, snake2, conv2])
        self.skip = c

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


def _block(block: DecoderBlock, x: torch.Tensor) -> _Chain:
    c_in = x.new_zeros(x.shape[0], block.conv_t1.in_channels, 0)
    c_out = x.new_zeros(x.shape[0], block.conv_t1.out_channels, 0)
    units = [block.res_unit1, block.res_unit2, block.res_unit3]
    return _Chain(
        [_Pointwise(block.snake1), _ConvTranspose(block.conv_t1, c_in)]
        + [_Residual(u, c_out) for u in units]
    )


class DacDecodeStream:
    """One stream's decoder state over a shared :class:`~.dac.DacCodec` (weights are not copied).

    Args:
        codec: the decoder; its dtype and device are used for the state.
        batch: streams decoded together (each call's codes are ``[batch, S, n]``).

    ``push(codes)`` (int64 ``[batch, S, n]``, ``n >= 0``) returns float ``[batch, 1, m]``: the next ``m``
    samples of the one-shot waveform that no later frame can change. ``flush()`` ends the stream and
    returns the remaining samples; afterwards the stream is spent. Over a whole clip of ``T`` frames the
    outputs add up to ``codec.output_length(T)`` samples. Ids are checked as in ``DacCodec.decode``.

    Raises:
        ValueError: codes of the wrong rank or batch, more streams than codebooks, ids outside the
            codebook, or a push after ``flush``.
    """

    def __init__(self, codec: DacCodec, batch: int = 1) -> None:
        self.codec, self.batch, self.done = codec, batch, False
        p = next(codec.parameters())
        dec = codec.decoder
        x = self.no_latents = torch.zeros(batch, codec.cfg.hidden_size, 0, dtype=p.dtype, device=p.device)
        parts = [_Conv(dec.conv1, x)]
        for block in dec.block:
            parts.append(_block(block, x))
        out = x.new_zeros(batch, dec.conv2.in_channels, 0)
        parts += [_Pointwise(dec.snake1), _Conv(dec.conv2, out), _Pointwise(torch.tanh)]
        self.chain = _Chain(parts)

    def _check(self, codes: torch.Tensor) -> None:
        if self.done:
            raise ValueError("push after flush: the stream has ended")
        self.codec.check_codes(codes)
        if codes.shape[0] != self.batch:
            raise ValueError(f"codes must be [{self.batch}, S, n], got shape {list(codes.shape)}")

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        self._check(codes)
        return self.chain.push(self.codec.quantizer.from_codes(codes) if codes.shape[-1] else self.no_latents)

    @torch.no_grad()
    def flush(self) -> torch.Tensor:
        if self.done:
            raise ValueError("flush after flush: the stream has ended")
        self.done = True
        return self.chain.flush()
