"""Several requests' Code2Wav streams decoded in one batched forward (the codec batching across requests
that vLLM-Omni's Code2Wav stage lacks: it decodes one request's chunk per forward).

A :class:`~.code2wav_stream.Code2WavStream` keeps state of fixed shapes: the pre-transformer's sliding-window
KV cache always holds ``sliding_window − 1`` frames (zeros before frame 0, masked out), the convs their halos
and overlap-add tails. So the states of ``B`` streams that push the same number of frames ``n`` stack along
the batch as they are; only the positions differ per row: each row takes RoPE at its own frames and its
own mask (:meth:`~.code2wav_stream.PreTransformerStream.push` with ``positions`` ``[B, n]``), so every row
attends to exactly the keys it would alone and the streaming left context stays right per request.

Each row equals that stream pushed alone within float rounding (the batched GEMMs may sum in another
order), and every stream's state afterwards is that of its single push. Streams whose transposed convs are
still cropping their start (no push yet) stack only with streams at the same crop (:func:`stack_key`).
"""

from __future__ import annotations

import torch

from omniduplex.models.conv_stream import check_batch_rows, stack_states, unstack_states
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream


def stack_key(stream: Code2WavStream) -> tuple:
    """Streams with equal keys can share a batched push of the same frame count: ``(steady,)`` (a stream
    before its first push still crops its transposed convs' start; after it, never again)."""
    return (stream.steady,)


def rows_state(streams: list[Code2WavStream]) -> list[torch.Tensor]:
    """The streams' :meth:`~.Code2WavStream.state_tensors` stacked along the batch, in that order: each
    ``[B, ...]`` (every stream a single row)."""
    per = [s.state_tensors() for s in streams]
    return [torch.cat(ts) for ts in zip(*per)]


def give_rows(streams: list[Code2WavStream], state: list[torch.Tensor], frames: int) -> None:
    """Give stream ``b`` row ``b`` of ``state`` (``[B', ...]`` tensors, ``B' >= B``, in the order of
    :meth:`~.Code2WavStream.state_tensors`) as views, and advance each stream's position by ``frames``."""
    for b, s in enumerate(streams):
        s.load_state([t[b : b + 1] for t in state])
        s.transformer.pos += frames


def row_positions(streams: list[Code2WavStream], frames: int, device: torch.device) -> torch.Tensor:
    """int64 ``[B, frames]``: row ``b`` holds ``streams[b].pos … + frames − 1``."""
    start = torch.tensor([s.pos for s in streams], dtype=torch.int64)
    return (start[:, None] + torch.arange(frames)[None, :]).to(device)


def check_rows(streams: list[Code2WavStream], codes: torch.Tensor) -> None:
    """Raise ``ValueError`` for a batch :func:`push_together` cannot take (nothing is changed)."""
    check_batch_rows(streams, "model", codes, "code2wav batch")
    if len({stack_key(s) for s in streams}) != 1:
        raise ValueError("code2wav batch: streams before and after their first push cannot stack")


@torch.no_grad()
def push_together(streams: list[Code2WavStream], codes: torch.Tensor) -> torch.Tensor:
    """Decode the next ``n`` frames of several single-row streams in one batched forward.

    Args:
        streams: ``B`` open :class:`~.Code2WavStream` objects (``batch=1``) over the same decoder, distinct,
            all before or all after their first push (:func:`stack_key`).
        codes: int ``[B, num_quantizers, n]``, ``n >= 1``; row ``b`` continues ``streams[b]``.

    Returns:
        float ``[B, 1, m]`` at 24 kHz (model dtype): row ``b`` equals ``streams[b].push(codes[b:b+1])``
        within float rounding, and every stream's state moves on as that single push would move it.

    Raises:
        ValueError: as :func:`check_rows`. Nothing changes on an error.
    """
    check_rows(streams, codes)
    if len(streams) == 1:
        return streams[0].push(codes)
    model, n = streams[0].model, codes.shape[-1]
    batched = Code2WavStream(model, len(streams))
    state = rows_state(streams)
    layers = len(batched.transformer.kv)
    batched.transformer.kv = [(state[2 * i], state[2 * i + 1]) for i in range(layers)]
    stack_states([s.convs for s in streams], batched.convs)  # crops (host state) along with the tensors
    x = model.embed(codes.to(batched.no_samples.device))
    positions = row_positions(streams, n, x.device)
    pcm = batched.push_embedded(x, positions)
    unstack_states(batched.convs, [s.convs for s in streams])
    kv = [t for pair in batched.transformer.kv for t in pair]
    for b, s in enumerate(streams):
        s.transformer.kv = [(kv[2 * i][b : b + 1], kv[2 * i + 1][b : b + 1]) for i in range(layers)]
        s.transformer.pos += n
    return pcm

