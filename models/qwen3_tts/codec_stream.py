"""Streaming 12 Hz codec decode with per-layer state: every frame is decoded once, the output is exact.

:class:`CodecStream` is the stateful twin of :class:`~.codec.CodecDecoder`, built from Qwen3-Omni's
Code2Wav stream parts where the math is the same (:mod:`omniduplex.models.qwen3_omni.code2wav_stream`):

- the quantizer decode is per frame (no state);
- ``pre_conv`` (causal, kernel 3) keeps its last 2 inputs;
- the pre-transformer keeps its sliding-window KV cache (the last 71 frames of every layer);
- the upsampling and SnakeBeta decoder keep causal-conv halos and transposed-conv overlap-add tails.

The decoder is causal, so after pushes of ``n`` frames the outputs hold exactly ``n · 1920`` samples,
equal to ``decoder(codes)`` of those frames within float rounding (~1e-6), whatever the split.

:class:`StreamingDecoder` puts the serving schedule on top: pieces of ``first_chunk`` frames, then
``chunk`` frames, the rest at the end (vLLM-Omni's 1 / 25 by default, :data:`~.codec.STREAM_FIRST_CHUNK`).
"""

from __future__ import annotations

import torch

from omniduplex.models.conv_stream import OneShotEnd
from omniduplex.models.qwen3_omni.code2wav_stream import PreTransformerStream, conv_chain, conv_stream
from omniduplex.models.qwen3_tts.codec import STREAM_CHUNK, STREAM_FIRST_CHUNK, CodecDecoder


class CodecStream(OneShotEnd):
    """One stream's decoder state over a shared :class:`~.codec.CodecDecoder` (weights are not copied).

    Args:
        decoder: the codec decoder; its dtype and device are used for the state.
        batch: rows decoded together (each call's codes are ``[batch, num_quantizers, n]``).

    ``push(codes)`` (int ``[batch, num_quantizers, n]``, ``n >= 0``) → float ``[batch, 1, n · 1920]``,
    the next samples (24 kHz) of the one-shot waveform. ``flush()`` ends the stream and returns no samples
    (the decoder has no look-ahead).

    Raises:
        ValueError: codes as :meth:`CodecDecoder.check_codes` refuses them, a wrong batch, or a push after
            ``flush``; a refused push changes no state.
    """

    def __init__(self, decoder: CodecDecoder, batch: int = 1) -> None:
        self.decoder, self.batch = decoder, batch
        self.pre_conv = conv_stream(decoder.pre_conv, batch)
        self.transformer = PreTransformerStream(decoder.pre_transformer)
        self.convs = conv_chain([m for pair in decoder.upsample for m in pair] + list(decoder.decoder), batch)
        self.no_samples = decoder.pre_conv.conv.weight.new_zeros(batch, 1, 0)

    @property
    def frames(self) -> int:
        """Frames decoded so far."""
        return self.transformer.pos

    @torch.no_grad()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        self.check_open("push")
        if codes.dim() == 3 and codes.shape[-1] == 0 and codes.shape[0] == self.batch:
            return self.no_samples
        self.decoder.check_codes(codes)
        if codes.shape[0] != self.batch:
            raise ValueError(f"codec: codes must be [{self.batch}, Q, n], got {list(codes.shape)}")
        d = self.decoder
        codes = codes.to(self.no_samples.device, torch.long)  # once per call, not per codebook lookup
        x = self.pre_conv.push(d.quantizer.decode(codes)).transpose(1, 2)  # [B, n, latent]
        ft = d.pre_transformer
        x = ft.output_proj(self.transformer.push(ft.input_proj(x)))
        return self.convs.push(x.transpose(1, 2))

    def flush(self) -> torch.Tensor:
        self.close()
        return self.no_samples


class StreamingDecoder:
    """One utterance's codec stream on the serving schedule: push frames as the talker makes them, get a
    waveform piece each time ``first_chunk`` (first piece) or ``chunk`` (later pieces) frames are
    waiting; ``final`` also decodes the rest. Each frame is decoded once (:class:`CodecStream`), so the
    pieces put together equal ``decoder(all frames)`` within float rounding.

    Args:
        decoder: the codec decoder (shared).
        first_chunk, chunk: frames per piece (>= 1); the defaults are vLLM-Omni's 1 and 25.

    Raises:
        ValueError: chunk sizes < 1.
    """

    def __init__(
        self, decoder: CodecDecoder, first_chunk: int = STREAM_FIRST_CHUNK, chunk: int = STREAM_CHUNK
    ) -> None:
        if first_chunk < 1 or chunk < 1:
            raise ValueError(f"chunk sizes must be >= 1, got {first_chunk}, {chunk}")
        self.stream = CodecStream(decoder)
        self.hop = decoder.total_upsample
        self.first, self.chunk = first_chunk, chunk
        self.pending: list[torch.Tensor] = []  # [1, Q, n] frames not decoded yet
        self.pieces = 0  # pieces emitted

    @property
    def pending_frames(self) -> int:
        return sum(int(p.shape[-1]) for p in self.pending)

    def _sizes(self, have: int, final: bool) -> list[int]:
        """Frames of each piece that ``have`` pending frames complete now."""
        sizes = []
        while have:
            n = self.first if self.pieces + len(sizes) == 0 else self.chunk
            if have < n and not final:
                break
            sizes.append(min(n, have))
            have -= sizes[-1]
        return sizes

    def feed(self, frames: torch.Tensor) -> None:
        """Queue ``frames`` int ``[1, Q, n]`` (n may be 0) without decoding them.

        Raises ValueError as :meth:`CodecStream.push` (the frames are then not kept).
        """
        self.stream.check_open("push")
        if frames.shape[-1]:
            self.stream.decoder.check_codes(frames)
            if frames.shape[0] != 1:
                raise ValueError(f"codec: one utterance's frames must be [1, Q, n], got {list(frames.shape)}")
            self.pending.append(frames)

    def due(self, final: bool = False) -> list[int]:
        """Frames of each piece the pending frames complete now (with ``final``, the rest too)."""
        return self._sizes(self.pending_frames, final)

    def take(self, final: bool = False) -> tuple[torch.Tensor | None, list[int]]:
        """Pop the pending frames of the pieces due now: ``(codes [1, Q, sum(sizes)] or None, sizes)``.
        The caller decodes ``codes`` on :attr:`stream` (alone, or batched with other utterances:
        :func:`~.codec_batch.push_together`) and cuts the samples with :meth:`split`."""
        sizes = self.due(final)
        if not sizes:
            return None, []
        codes = torch.cat(self.pending, dim=-1)
        n = sum(sizes)
        self.pending = [codes[..., n:]] if codes.shape[-1] > n else []
        self.pieces += len(sizes)
        return codes[..., :n], sizes

    def split(self, samples: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        """Cut the decoded ``samples`` ``[1, 1, sum(sizes)·hop]`` into the pieces ``[1, 1, k·hop]``."""
        return list(samples.split([k * self.hop for k in sizes], dim=-1))

    @torch.no_grad()
    def push(self, frames: torch.Tensor, final: bool = False) -> list[torch.Tensor]:
        """Add ``frames`` int ``[1, Q, n]`` (n may be 0); returns the waveform pieces ``[1, 1, k·1920]``
        completed (with ``final``, also the last partial piece; the stream then ends).

        Raises ValueError as :meth:`CodecStream.push` (the frames are then not kept).
        """
        self.feed(frames)
        codes, sizes = self.take(final)
        # every piece's frames in one call: the output is the same as piece by piece
        pieces = self.split(self.stream.push(codes), sizes) if sizes else []
        if final:
            self.stream.flush()
        return pieces
