"""Streaming Code2Wav with per-layer state: each frame is decoded once, the output is exact.

:class:`Code2WavStream` keeps, per stream, the pre-transformer's sliding-window KV cache (the last
``sliding_window − 1`` frames of every layer, keys after RoPE at their absolute positions) and the state
of every conv (:mod:`.conv_stream`): causal convs keep their last ``(k−1)·dilation`` inputs, the trimmed
transposed convs their overlap-add tail, residual units nothing extra (causal branches have no latency).
After pushes of ``n`` frames in total the outputs add up to ``model.num_samples(n)`` samples, equal to
``model(codes)`` of those frames (float rounding, ~1e-6): the decoder's last ``lookahead_samples`` of a
span come out with the next frame, as in the one-shot decode.

Re-decoding windows with left context, as ``transformers``' :func:`chunked_decode` (kept here for parity
with the reference ``generate``) does, costs ``n + left`` frames per ``n`` and is exact only with left
context ``>= model.receptive_field_frames`` (8·71 transformer frames alone for the published config;
``transformers`` uses 25, an approximation). The stream costs ``n`` and is exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.conv_stream import (
    Chain,
    ConvStream,
    ConvTransposeStream,
    OneShotEnd,
    Pointwise,
    Residual,
    cropping,
)
from omniduplex.models.conv_stream import load_state as load_conv_state
from omniduplex.models.conv_stream import state_tensors as conv_state
from omniduplex.models.qwen3_omni.code2wav import (
    CausalConv1d,
    CausalTransConv1d,
    Code2Wav,
    ConvNeXtBlock,
    DecoderBlock,
    PreTransformer,
    ResidualUnit,
    SnakeBeta,
    TransformerLayer,
    rope,
)


def conv_stream(layer: nn.Module, batch: int):
    """The streaming twin of one Code2Wav conv-side layer (shared weights), for ``batch`` rows.

    Raises TypeError for a layer with no streaming form.
    """
    if isinstance(layer, CausalConv1d):
        return ConvStream(layer.conv, layer.pad, 0, batch)
    if isinstance(layer, CausalTransConv1d):
        return ConvTransposeStream(layer.conv, *layer.crops, batch)
    if isinstance(layer, SnakeBeta):
        return Pointwise(layer)
    if isinstance(layer, ResidualUnit):
        parts = [layer.act1, layer.conv1, layer.act2, layer.conv2]
        w = layer.conv1.conv.weight
        return Residual(Chain([conv_stream(m, batch) for m in parts]), w.shape[1], w, batch)
    if isinstance(layer, DecoderBlock):
        return Chain([conv_stream(m, batch) for m in layer.block])
    if isinstance(layer, ConvNeXtBlock):

        def mlp(h: torch.Tensor, b: ConvNeXtBlock = layer) -> torch.Tensor:
            h = b.norm(h.transpose(1, 2))
            return (b.pwconv2(F.gelu(b.pwconv1(h))) * b.gamma).transpose(1, 2)

        w = layer.dwconv.conv.weight
        return Residual(Chain([conv_stream(layer.dwconv, batch), Pointwise(mlp)]), w.shape[0], w, batch)
    raise TypeError(f"no streaming form for {type(layer).__name__}")


def conv_chain(layers: list[nn.Module], batch: int) -> Chain:
    """Streams of ``layers`` in series, then the output clamp to [-1, 1]."""
    return Chain([conv_stream(m, batch) for m in layers] + [Pointwise(lambda x: x.clamp(-1.0, 1.0))])


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, kv_heads, L, D]`` → ``[B, kv_heads · groups, L, D]``, head ``h`` reading kv head ``h // groups``
    (``repeat_interleave`` on dim 1, as a broadcast: no host sync, capturable in a CUDA graph)."""
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def _rope_rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`~.code2wav.apply_rope` of ``x`` ``[B, T, heads, D]`` by ``cos``/``sin`` ``[T, D]`` (every row at
    the same positions) or ``[B, T, D]`` (each row at its own)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-2).to(x.dtype) + rot * sin.unsqueeze(-2).to(x.dtype)


class PreTransformerStream:
    """One stream's state of a :class:`~.code2wav.PreTransformer`: the sliding-window KV cache of every
    layer (the last ``sliding_window − 1`` frames, keys after RoPE at their absolute positions).

    ``push(x)`` (``[batch, t, hidden]``, ``t >= 1``, frames ``pos .. pos + t − 1``) → the normed output
    ``[batch, t, hidden]``, equal to rows ``pos .. pos + t − 1`` of ``pre(all frames so far)`` (float
    rounding): attention reaches ``sliding_window − 1`` frames back, all of which are cached.

    ``fixed``: the cache holds ``sliding_window − 1`` frames from the start (zeros before frame 0, masked
    out), so the state has the same shapes after every push (a push can be replayed as a CUDA graph);
    ``batch`` rows. Otherwise it grows to that size over the first frames.
    """

    def __init__(self, pre: PreTransformer, batch: int = 1, fixed: bool = False) -> None:
        self.pre, self.window, self.pos = pre, pre.window, 0
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(pre.layers)
        if fixed:
            for i, layer in enumerate(pre.layers):
                a = layer.self_attn
                k = a.k_proj.weight.new_zeros(batch, a.kv_heads, self.window - 1, a.head_dim)
                self.kv[i] = (k, torch.zeros_like(k))

    def _attend(self, i: int, layer: TransformerLayer, x, cos, sin, mask) -> torch.Tensor:
        a, (b, t, _) = layer.self_attn, x.shape
        q = _rope_rows(a.q_proj(x).view(b, t, a.heads, a.head_dim), cos, sin).transpose(1, 2)
        k = _rope_rows(a.k_proj(x).view(b, t, a.kv_heads, a.head_dim), cos, sin).transpose(1, 2)
        v = a.v_proj(x).view(b, t, a.kv_heads, a.head_dim).transpose(1, 2)
        if self.kv[i] is not None:
            k, v = torch.cat([self.kv[i][0], k], dim=2), torch.cat([self.kv[i][1], v], dim=2)
        drop = max(0, k.shape[2] - (self.window - 1))  # keys no later query can reach
        self.kv[i] = (k[:, :, drop:], v[:, :, drop:])
        groups = a.heads // a.kv_heads
        k, v = _repeat_heads(k, groups), _repeat_heads(v, groups)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return a.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def push(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: int64 ``[t]`` on ``x``'s device, ``pos .. pos + t − 1`` (given by a caller that
        replays the push as a CUDA graph, where the host's ``pos`` cannot be read); default from ``pos``.
        Or int64 ``[batch, t]``: each row at its own positions (rows of streams at different frames stacked
        into one batch, :mod:`.code2wav_batch`); the caller then keeps each row's ``pos`` itself."""
        pre, t = self.pre, x.shape[1]
        if positions is None:
            positions = torch.arange(self.pos, self.pos + t, device=x.device)
        cos, sin = rope(positions.reshape(-1), pre.head_dim, pre.theta)
        cos, sin = cos.view(*positions.shape, -1), sin.view(*positions.shape, -1)  # [(batch,) t, head_dim]
        # key m holds frame positions[0] − cached + m; query j attends iff 0 <= distance < window and the
        # key is a real frame (a fixed cache starts with zeros before frame 0); per row when 2-D
        cached = 0 if self.kv[0] is None else self.kv[0][0].shape[2]
        keys = positions[..., :1] - cached + torch.arange(cached + t, device=x.device)
        dist = positions[..., :, None] - keys[..., None, :]
        mask = (dist >= 0) & (dist < self.window) & (keys >= 0)[..., None, :]
        if mask.dim() == 3:  # [batch, t, keys] → one mask per row, broadcast over heads
            mask = mask[:, None]
        for i, layer in enumerate(pre.layers):
            h = self._attend(i, layer, layer.input_layernorm(x), cos, sin, mask)
            x = x + layer.self_attn_layer_scale(h)
            x = x + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(x)))
        self.pos += t
        return pre.norm(x)


class Code2WavStream(OneShotEnd):
    """One stream's decoder state over a shared :class:`~.code2wav.Code2Wav` (weights are not copied).

    Args:
        model: the decoder; its dtype and device are used for the state.
        batch: streams decoded together (each call's codes are ``[batch, num_quantizers, n]``).

    ``push(codes)`` (int ``[batch, num_quantizers, n]``, ``n >= 0``) → float ``[batch, 1, m]``, the next
    ``m`` samples (24 kHz) of the one-shot waveform. ``flush()`` returns nothing new (the one-shot decode
    trims the look-ahead tail too) and ends the stream; it exists so every vocoder stream has the same
    interface.

    After its first push the stream's state (:meth:`state_tensors`: the pre-transformer's fixed-size KV
    cache, the convs' halos and tails) keeps its shapes and :attr:`pos` is its only host-side state, so a
    push of ``n`` frames can be replayed as a CUDA graph on buffers holding a copy of that state
    (:meth:`push_embedded`, :mod:`omniduplex.pipeline.stages.code2wav_graphs`).

    Raises:
        ValueError: codes as :meth:`Code2Wav.embed` refuses them, a wrong batch, or a push after ``flush``.
    """

    def __init__(self, model: Code2Wav, batch: int = 1) -> None:
        self.model, self.batch = model, batch
        self.transformer = PreTransformerStream(model.pre_transformer, batch, fixed=True)
        self.no_samples = model.code_embedding.weight.new_zeros(batch, 1, 0)
        self.convs = conv_chain(model._layers(), batch)

    @property
    def pos(self) -> int:
        """Frames pushed so far."""
        return self.transformer.pos

    @property
    def steady(self) -> bool:
        """Whether a push changes only tensors of fixed shape and :attr:`pos` (after the first push of a
        frame, when every transposed conv has cropped its start)."""
        return not cropping(self.convs)

    def state_tensors(self) -> list[torch.Tensor]:
        """The state between pushes: every layer's ``(k, v)`` then the convs' (:func:`.conv_stream
        .state_tensors`)."""
        kv = [t for pair in self.transformer.kv for t in pair]
        return kv + conv_state(self.convs)

    def load_state(self, tensors: list[torch.Tensor]) -> None:
        """Set the state from tensors in the order of :meth:`state_tensors`."""
        n = len(self.transformer.kv)
        self.transformer.kv = [(tensors[2 * i], tensors[2 * i + 1]) for i in range(n)]
        load_conv_state(self.convs, tensors[2 * n :])

    def push_embedded(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The push of frames already embedded (``x`` ``[batch, n, hidden]``, :meth:`Code2Wav.embed`) at
        ``positions`` int64 ``[n]`` on the device: no validation, no host sync (capturable in a CUDA graph);
        advances :attr:`pos`."""
        return self.convs.push(self.transformer.push(x, positions).transpose(1, 2))

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        self.check_open("push")
        if codes.dim() == 3 and codes.shape[-1] == 0:
            return self.no_samples
        x = self.model.embed(codes.to(self.no_samples.device))  # validates the codes (landed on any device)
        if x.shape[0] != self.batch:
            raise ValueError(f"codes must be [{self.batch}, Q, n], got shape {list(codes.shape)}")
        return self.convs.push(self.transformer.push(x).transpose(1, 2))

    def flush(self) -> torch.Tensor:
        self.close()
        return self.no_samples


def chunked_decode(
    model: Code2Wav, codes: torch.Tensor, chunk_frames: int = 300, left_context_frames: int = 25
) -> torch.Tensor:
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
        raise ValueError(
            f"need chunk_frames >= 1 and left_context_frames >= 0, got {chunk_frames}, {left_context_frames}"
        )
    n, start, out = codes.shape[-1], 0, []
    while start < n:
        end = min(start + chunk_frames, n)
        context = min(left_context_frames, start)
        out.append(model(codes[..., start - context : end])[..., context * model.total_upsample :])
        start = end
    return torch.cat(out, dim=-1)
