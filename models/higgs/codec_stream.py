"""Exact streaming decode of the Higgs audio tokenizer: each frame decoded once, streamed == one-shot.

The quantizer and ``fc2`` act per frame; the acoustic decoder's convolutions are centred (DAC), so a
sample is final only once the decoder's look-ahead has arrived. :class:`HiggsCodecStream` keeps every
layer's state in :func:`omniduplex.models.codecs.dac_stream.decoder_chain` (halos, transposed-conv
overlap-add tails with Higgs' ``output_padding``, delayed skip paths) and returns each sample as soon as
no later frame can change it; ``flush`` feeds the one-shot decode's zero right padding. Over a clip of
``T`` frames the pieces add up to ``T · hop_length`` samples equal to :meth:`~.codec.HiggsCodecDecoder.decode`
(float rounding, ~1e-6), for any split into pushes.
"""

from __future__ import annotations

import torch

from omniduplex.models.codecs.dac_stream import decoder_chain
from omniduplex.models.conv_stream import OneShotEnd
from omniduplex.models.higgs.codec import HiggsCodecDecoder


class HiggsCodecStream(OneShotEnd):
    """Decoder state of ``batch`` streams over a shared :class:`HiggsCodecDecoder` (weights not copied).

    ``push(codes)`` (int64 ``[batch, Q, n]``, ``n >= 0``) → float ``[batch, 1, m]`` final samples;
    ``flush()`` ends the stream and returns the rest.

    Raises:
        ValueError: codes :meth:`HiggsCodecDecoder.check_codes` refuses, a wrong batch, or a push after
            ``flush``; a refused push changes no state.
    """

    def __init__(self, codec: HiggsCodecDecoder, batch: int = 1) -> None:
        self.codec, self.batch = codec, batch
        self.chain = decoder_chain(codec.acoustic_decoder, batch, squash=False)
        p = codec.fc2.weight
        self.no_latents = p.new_zeros(batch, codec.cfg.acoustic_hidden_size, 0)

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        self.check_open("push")
        self.codec.check_codes(codes)
        if codes.shape[0] != self.batch:
            raise ValueError(f"codes must be [{self.batch}, Q, n], got shape {list(codes.shape)}")
        return self.chain.push(self.codec.latents(codes) if codes.shape[-1] else self.no_latents)

    @torch.no_grad()
    def flush(self) -> torch.Tensor:
        self.close()
        return self.chain.flush()


class StreamingDecoder:
    """One utterance's 24 kHz waveform from its code frames as the engine emits them.

    ``feed(frames)``: int ``[n, Q]`` frames (the un-delayed codes of
    :class:`~omniduplex.pipeline.speech.higgs.
    HiggsEngine` events, ``n >= 0``) → fp32 ``[m]``, the samples now final. ``flush()`` → fp32 ``[m]``,
    the rest; the stream then ends. Every frame is decoded once; the pieces concatenated equal the one-shot
    decode of all frames (``T · hop_length`` samples).

    Raises:
        ValueError: frames of the wrong shape or ids outside the codebook (nothing is kept), or a call after
            ``flush``.
    """

    def __init__(self, codec: HiggsCodecDecoder) -> None:
        self.codec = codec
        self.stream = HiggsCodecStream(codec)
        self.frames = 0  # frames fed
        self.samples = 0  # samples returned

    def feed(self, frames: torch.Tensor) -> torch.Tensor:
        frames = torch.as_tensor(frames)
        if frames.dim() != 2:
            raise ValueError(f"frames must be [n, Q], got shape {list(frames.shape)}")
        out = self.stream.push(frames.T.unsqueeze(0).to(torch.long)).reshape(-1).float()
        self.frames += frames.shape[0]
        self.samples += out.numel()
        return out

    def flush(self) -> torch.Tensor:
        out = self.stream.flush().reshape(-1).float()
        self.samples += out.numel()
        return out
