"""Streaming AudioVAE decode with per-layer state: every latent frame is decoded once, the output is exact.

The decoder is causal (:mod:`.audio_vae`), so its streaming twin (:mod:`omniduplex.models.conv_stream`) keeps
per stream only each convolution's last ``(k−1)·dilation`` inputs and each transposed convolution's
overlap-add tail; Snake, the rate condition and tanh are per sample. After pushes of ``n`` frames in total
the outputs hold exactly ``n · decode_hop`` samples, equal to ``decoder(all frames)`` within float rounding,
whatever the split (the reference's ``StreamingVAEDecoder`` patches the same state into the modules; here it
lives outside them, so many streams share one decoder).
"""

from __future__ import annotations

import torch
from torch import nn

from omniduplex.models.codecs.dac import Snake1d
from omniduplex.models.conv_stream import (
    Chain,
    ConvStream,
    ConvTransposeStream,
    OneShotEnd,
    Pointwise,
    Residual,
    stack_states,
    unstack_states,
)
from omniduplex.models.voxcpm2.audio_vae import (
    AudioVAE,
    CausalConv,
    CausalConvT,
    DecoderBlock,
    RateCondition,
    ResidualUnit,
)


def _stream(layer: nn.Module, batch: int):
    """The streaming form of one decoder layer (weights shared). Raises TypeError for any other layer."""
    if isinstance(layer, CausalConv):
        if layer.stride[0] != 1:
            raise TypeError("strided convolutions are encoder-side: no streaming form")
        return ConvStream(layer, layer.left, 0, batch)
    if isinstance(layer, CausalConvT):
        return ConvTransposeStream(layer, 0, layer.trim, batch)
    if isinstance(layer, (Snake1d, RateCondition, nn.Tanh)):
        return Pointwise(layer)
    if isinstance(layer, ResidualUnit):
        w = layer.block[1].weight
        return Residual(Chain([_stream(m, batch) for m in layer.block]), w.shape[0], w, batch)
    if isinstance(layer, DecoderBlock):
        return Chain([_stream(m, batch) for m in layer.block])
    raise TypeError(f"no streaming form for {type(layer).__name__}")


class VAEStream(OneShotEnd):
    """One utterance's decoder state over a shared :class:`~.audio_vae.AudioVAE`.

    Args:
        vae: the loaded AudioVAE (its decoder's dtype and device hold the state).
        context: optional latent patches ``[k, P, D]`` decoded first and dropped (a continuation prompt's
            last patches, as the reference's one-shot decode prepends and trims them).

    ``feed(latents)`` (``[n, P, D]`` patches or ``[n, D]`` frames, ``n >= 0``) → float32 ``[n·P·hop]``
    (``[n·hop]``) samples at the output rate, the next part of the one-shot waveform. ``flush()`` ends the
    stream and returns no samples (the decoder has no look-ahead).

    Raises:
        ValueError: latents of the wrong width, or a feed after ``flush``.
    """

    def __init__(self, vae: AudioVAE, context: torch.Tensor | None = None, batch: int = 1) -> None:
        self.vae = vae
        dec = vae.decoder
        parts = []
        for layer, cond in zip(dec.model, dec.sr_cond_model):
            if cond is not None:
                parts.append(_stream(cond, batch))
            parts.append(_stream(layer, batch))
        self.chain = Chain(parts)
        self.frames = 0
        self.dtype = dec.model[0].weight.dtype
        if context is not None and context.shape[0]:
            self.feed(context)
            self.frames = 0

    @torch.no_grad()
    def feed(self, latents: torch.Tensor) -> torch.Tensor:
        self.check_open("feed")
        d = self.vae.cfg.latent_dim
        if latents.shape[-1] != d or latents.dim() not in (2, 3):
            raise ValueError(f"latents must be [n, P, {d}] or [n, {d}], got {list(latents.shape)}")
        z = latents.reshape(-1, d)
        if z.shape[0] == 0:
            return torch.zeros(0)
        self.frames += z.shape[0]
        w = self.vae.decoder.model[0].weight
        out = self.chain.push(z.T[None].to(device=w.device, dtype=self.dtype))
        return out.reshape(-1).float().cpu()

    def flush(self) -> torch.Tensor:
        self.close()
        return torch.zeros(0)


@torch.no_grad()
def feed_together(streams: list[VAEStream], latents: torch.Tensor) -> torch.Tensor:
    """The next ``n`` patches of several streams in one batched decoder call (states stacked, then split).

    Args:
        streams: ``B`` distinct open :class:`VAEStream` objects over one AudioVAE.
        latents: ``[B, n, P, D]``; row ``b`` continues ``streams[b]``.

    Returns:
        float32 ``[B, n·P·hop]``: row ``b`` equals ``streams[b].feed(latents[b])`` (float rounding), and each
        stream's state moves on as that feed would move it.

    Raises:
        ValueError: a row count other than ``len(streams)``, a closed or repeated stream, streams of other
            AudioVAEs, or latents of the wrong width. Nothing changes on an error.
    """
    if not streams or latents.dim() != 4 or latents.shape[0] != len(streams):
        raise ValueError(f"feed_together: need [{len(streams)}, n, P, D] latents, got {list(latents.shape)}")
    vae = streams[0].vae
    for st in streams:
        st.check_open("feed")
        if st.vae is not vae:
            raise ValueError("feed_together: streams of different AudioVAEs")
    if len({id(st) for st in streams}) != len(streams):
        raise ValueError("feed_together: a stream appears twice")
    if len(streams) == 1:
        return streams[0].feed(latents[0])[None]
    d = vae.cfg.latent_dim
    if latents.shape[-1] != d:
        raise ValueError(f"feed_together: latents must be [B, n, P, {d}], got {list(latents.shape)}")
    b = len(streams)
    z = latents.reshape(b, -1, d).transpose(1, 2)
    batched = VAEStream(vae, batch=b)
    stack_states([st.chain for st in streams], batched.chain)
    w = vae.decoder.model[0].weight
    out = batched.chain.push(z.to(device=w.device, dtype=batched.dtype))
    unstack_states(batched.chain, [st.chain for st in streams])
    for st in streams:
        st.frames += z.shape[-1]
    return out.reshape(b, -1).float().cpu()
