"""Several utterances' codec streams decoded in one batched call: the state of each
:class:`~.codec_stream.CodecStream` is stacked along the batch, the frames go through the decoder once,
and each stream gets its rows of the new state back.

The decoder's math allows it whenever every stream pushes the same number of frames ``n``:

- the conv side keeps per-stream state of a fixed size (causal halos of ``(k−1)·dilation`` inputs,
  overlap-add tails of ``kernel − stride`` samples, no residual skip backlog), so it stacks as is;
- the pre-transformer's streams sit at different positions with sliding-window KV caches of different
  lengths (``min(frames so far, window − 1)``): queries take RoPE at each stream's own positions, and
  the caches are left-padded to the longest with the padding masked out, so each row attends to exactly
  the keys it would alone.

Each row equals that stream decoded alone within float rounding (masked keys add exact zeros; the
reductions may differ in order), and the streams' states afterwards are those of single decodes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omniduplex.models.conv_stream import Chain, ConvTransposeStream, Residual, check_batch_rows
from omniduplex.models.conv_stream import stack_states as _stack_convs
from omniduplex.models.conv_stream import unstack_states as _unstack_convs
from omniduplex.models.qwen3_omni.code2wav import rope
from omniduplex.models.qwen3_omni.code2wav_stream import PreTransformerStream
from omniduplex.models.qwen3_tts.codec_stream import CodecStream


def _transformer_push(streams: list[PreTransformerStream], x: torch.Tensor) -> torch.Tensor:
    """:meth:`PreTransformerStream.push` of ``x`` ``[B, t, hidden]`` (row ``b`` → ``streams[b]``), batched."""
    pre, (batch, t, _) = streams[0].pre, x.shape
    window = pre.window
    pos = torch.tensor([s.pos for s in streams], device=x.device)
    positions = pos[:, None] + torch.arange(t, device=x.device)[None, :]  # [B, t]
    cos, sin = rope(positions.reshape(-1), pre.head_dim, pre.theta)
    cos, sin = cos.view(batch, t, 1, -1), sin.view(batch, t, 1, -1)
    cached = [0 if s.kv[0] is None else s.kv[0][0].shape[2] for s in streams]
    longest = max(cached)
    # key m of the padded cache + new keys: padding iff m < longest − cached[b]; query j sits `longest` after
    keys = torch.arange(longest + t, device=x.device)
    dist = torch.arange(t, device=x.device)[:, None] + longest - keys[None, :]  # [t, longest + t]
    pad = torch.tensor([longest - c for c in cached], device=x.device)
    mask = (dist >= 0) & (dist < window)
    mask = mask[None] & (keys[None, None, :] >= pad[:, None, None])  # [B, t, longest + t]
    mask = mask[:, None]  # [B, 1, t, longest + t]

    def rot(h: torch.Tensor) -> torch.Tensor:  # [B, t, heads, D] at each row's own positions
        half = h.shape[-1] // 2
        return h * cos.to(h.dtype) + torch.cat((-h[..., half:], h[..., :half]), dim=-1) * sin.to(h.dtype)

    for i, layer in enumerate(pre.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = rot(a.q_proj(h).view(batch, t, a.heads, a.head_dim)).transpose(1, 2)
        k = rot(a.k_proj(h).view(batch, t, a.kv_heads, a.head_dim)).transpose(1, 2)
        v = a.v_proj(h).view(batch, t, a.kv_heads, a.head_dim).transpose(1, 2)
        old_k = k.new_zeros(batch, a.kv_heads, longest, a.head_dim)
        old_v = torch.zeros_like(old_k)
        for b, s in enumerate(streams):
            if cached[b]:
                old_k[b, :, longest - cached[b] :] = s.kv[i][0][0]
                old_v[b, :, longest - cached[b] :] = s.kv[i][1][0]
        k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        for b, s in enumerate(streams):  # each stream keeps its own last window − 1 keys
            start = max(longest - cached[b], k.shape[2] - (window - 1))
            s.kv[i] = (k[b : b + 1, :, start:], v[b : b + 1, :, start:])
        groups = a.heads // a.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + layer.self_attn_layer_scale(a.o_proj(out.transpose(1, 2).reshape(batch, t, -1)))
        x = x + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(x)))
    for s in streams:
        s.pos += t
    return pre.norm(x)


@torch.no_grad()
def push_together(streams: list[CodecStream], codes: torch.Tensor) -> torch.Tensor:
    """Decode the next ``n`` frames of several single-row streams in one batched call.

    Args:
        streams: ``B`` open :class:`CodecStream` objects (``batch=1``) over the same decoder, distinct.
        codes: int ``[B, num_quantizers, n]``, ``n >= 1``; row ``b`` continues ``streams[b]``.

    Returns:
        float ``[B, 1, n · total_upsample]``: row ``b`` equals ``streams[b].push(codes[b:b+1])`` (float
        rounding), and every stream's state moves on as that single push would move it.

    Raises:
        ValueError: bad codes (:meth:`~.codec.CodecDecoder.check_codes`), a row count other than
            ``len(streams)``, a stream with ``batch != 1``, a closed stream, or streams of other decoders.
            Nothing changes on an error.
    """
    if len(streams) == 1:
        return streams[0].push(codes)
    check_batch_rows(streams, "decoder", codes, "codec batch")
    decoder = streams[0].decoder
    crops = {tuple(c.crop for c in _transposed(s.convs)) for s in streams}
    if len(crops) != 1:
        raise ValueError("codec batch: streams at different transposed-conv crops cannot stack")
    batched = CodecStream(decoder, len(streams))
    _stack_convs([s.pre_conv for s in streams], batched.pre_conv)
    _stack_convs([s.convs for s in streams], batched.convs)
    codes = codes.to(batched.no_samples.device, torch.long)  # once per call, not per codebook lookup
    x = batched.pre_conv.push(decoder.quantizer.decode(codes)).transpose(1, 2)  # [B, n, latent]
    ft = decoder.pre_transformer
    x = ft.output_proj(_transformer_push([s.transformer for s in streams], ft.input_proj(x)))
    out = batched.convs.push(x.transpose(1, 2))
    _unstack_convs(batched.pre_conv, [s.pre_conv for s in streams])
    _unstack_convs(batched.convs, [s.convs for s in streams])
    return out


def _transposed(node) -> list[ConvTransposeStream]:
    if isinstance(node, ConvTransposeStream):
        return [node]
    if isinstance(node, Residual):
        return _transposed(node.branch)
    if isinstance(node, Chain):
        return [c for p in node.parts for c in _transposed(p)]
    return []
