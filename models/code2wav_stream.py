"""Streaming Code2Wav decode by left context: pure functions over a :class:`~.code2wav.Code2Wav`.

A window of frames ``[start, end)`` is decoded from ``codes[start − left : end]``; the samples owed to the
left context are dropped. Two flavours:

* :func:`decode_window` / :func:`stream_decode` — seamless. Consecutive windows tile the one-shot
  waveform ``model(codes)`` with no gap or overlap. Whenever ``left_context_frames >=
  model.receptive_field_frames`` the result equals the one-shot decode up to float rounding (~1e-5);
  with less left context (e.g. the 25 frames ``transformers`` uses, against 8 layers × 71 frames of
  sliding-window reach alone for the published config) it is only an approximation near each window's
  start.
* :func:`chunked_decode` — ``transformers``' ``Qwen3OmniMoeCode2Wav.chunked_decode``, kept for parity with
  the reference ``generate``. It drops exactly ``left·total_upsample`` samples per chunk, so every chunk
  also loses its last ``model.lookahead_samples`` samples (555 = 23 ms for the published config): its
  output is ``lookahead_samples`` shorter per chunk than the one-shot decode and is not seamless.
"""

from __future__ import annotations

import torch

from .code2wav import Code2Wav


def window_sample_span(model: Code2Wav, start: int, end: int) -> tuple[int, int]:
    """Sample range ``[first, stop)`` of the one-shot waveform that :func:`decode_window` returns.

    ``first = max(0, start·U − lookahead)``, ``stop = end·U − lookahead`` with ``U = total_upsample``:
    a window emits the ``lookahead_samples`` tail of the previous frame (which needed frame ``start``)
    and holds back its own tail until the next window.
    """
    u, la = model.total_upsample, model.lookahead_samples
    return max(0, start * u - la), end * u - la


def decode_window(model: Code2Wav, codes: torch.Tensor, start: int, end: int, left_context_frames: int,
                  *, codes_offset: int = 0) -> torch.Tensor:
    """Decode frames ``[start, end)`` of a stream using up to ``left_context_frames`` earlier frames.

    Args:
        model: the decoder.
        codes: int ``[B, num_quantizers, n]`` holding stream frames ``[codes_offset, codes_offset + n)``
            (all codes so far, or just the window with its left context).
        start, end: absolute frame indices, ``0 <= start < end``.
        left_context_frames: frames before ``start`` to re-decode; clipped to ``start`` at stream start.
        codes_offset: absolute frame index of ``codes[..., 0]``.

    Returns:
        ``[B, 1, stop − first]`` float samples ``[first, stop)`` of the one-shot waveform (see
        :func:`window_sample_span`): ``end·U − lookahead`` samples when ``start == 0``, else
        ``(end − start)·U``. Exact (~1e-5) when ``left_context_frames >= model.receptive_field_frames``;
        approximate below that.

    Raises:
        ValueError: bad window bounds, codes that do not hold ``[start − context, end)``, or ``start > 0``
            with too little left context to cover the lookahead tail (needs ``context·U >= lookahead``);
            bad code ids as :meth:`Code2Wav.embed`.
    """
    if not 0 <= start < end:
        raise ValueError(f"code2wav window [{start}, {end}) is empty or negative")
    if left_context_frames < 0:
        raise ValueError(f"left_context_frames={left_context_frames} must be >= 0")
    context = min(left_context_frames, start)
    first = start - context
    if first < codes_offset or end > codes_offset + codes.shape[-1]:
        raise ValueError(f"code2wav window [{start}, {end}) with {context} frames of left context needs "
                         "frames "
                         f"[{first}, {end}); codes hold [{codes_offset}, {codes_offset + codes.shape[-1]})")
    u, la = model.total_upsample, model.lookahead_samples
    drop = context * u - la if start > 0 else 0
    if drop < 0:
        raise ValueError(f"code2wav window at frame {start} needs >= {-(-la // u)} frames of left context to "
                         f"emit the {la}-sample lookahead tail of frame {start - 1}; got {context}")
    wav = model(codes[..., first - codes_offset: end - codes_offset])
    return wav[..., drop:]


def stream_decode(model: Code2Wav, codes: torch.Tensor, chunk_frames: int, left_context_frames: int,
                  initial_chunk_frames: int | None = None) -> torch.Tensor:
    """Seamless chunked decode: :func:`decode_window` over consecutive chunks, concatenated.

    Args:
        codes: int ``[B, num_quantizers, n]``.
        chunk_frames: frames per window (the last window may be shorter).
        left_context_frames: as :func:`decode_window`.
        initial_chunk_frames: size of the first window (default ``chunk_frames``).

    Returns:
        ``[B, 1, model.num_samples(n)]``, equal to ``model(codes)`` (~1e-5) when ``left_context_frames >=
        model.receptive_field_frames``; approximate with less context.

    Raises:
        ValueError: ``chunk_frames`` or ``initial_chunk_frames`` < 1; as :func:`decode_window`.
    """
    first = chunk_frames if initial_chunk_frames is None else initial_chunk_frames
    if chunk_frames < 1 or first < 1:
        raise ValueError(f"chunk sizes must be >= 1, got chunk_frames={chunk_frames}, initial={first}")
    n, start, size, out = codes.shape[-1], 0, first, []
    while start < n:
        end = min(start + size, n)
        out.append(decode_window(model, codes, start, end, left_context_frames))
        start, size = end, chunk_frames
    return torch.cat(out, dim=-1)


def chunked_decode(model: Code2Wav, codes: torch.Tensor, chunk_frames: int = 300,
                   left_context_frames: int = 25) -> torch.Tensor:
    """``transformers``' ``Qwen3OmniMoeCode2Wav.chunked_decode(codes, chunk_size, left_context_size)``.

    Each chunk ``[s, e)`` (``e − s = chunk_frames``, last one ragged) is decoded from ``codes[s − c : e]``
    with ``c = min(left_context_frames, s)`` and its first ``c·total_upsample`` samples dropped.

    Returns:
        ``[B, 1, n·total_upsample − k·lookahead_samples]`` for ``k`` chunks. Chunk outputs are samples
        ``[s·U, e·U − lookahead)`` of the one-shot decode when ``left_context_frames >=
        receptive_field_frames`` (approximate below): the ``lookahead_samples`` before every internal chunk
        boundary are missing. Use :func:`stream_decode` for a seamless stream.

    Raises:
        ValueError: ``chunk_frames < 1`` or ``left_context_frames < 0``; bad codes as :meth:`Code2Wav.embed`.
    """
    if chunk_frames < 1 or left_context_frames < 0:
        raise ValueError(f"need chunk_frames >= 1 and left_context_frames >= 0, got {chunk_frames}, "
                         f"{left_context_frames}")
    n, start, out = codes.shape[-1], 0, []
    while start < n:
        end = min(start + chunk_frames, n)
        context = min(left_context_frames, start)
        out.append(model(codes[..., start - context: end])[..., context * model.total_upsample:])
        start = end
    return torch.cat(out, dim=-1)
