"""Streaming a Piper voice: its VITS graph split at the decoder, so a clause's audio comes out in pieces.

A Piper voice is one ONNX graph (VITS, Kim et al. 2021: text encoder, stochastic duration predictor, flow,
then the HiFi-GAN generator of Kong et al. 2020 as decoder) that turns a sentence's phoneme ids into its
whole waveform in one call. The decoder is most of the work (joe medium, "The capital of France is
Paris.", 1 thread: 115 ms for everything before it, 263 ms for it) and it is a stack of convolutions over
the latent frames (one frame = ``hop`` samples: 256 at 22.05 kHz, 11.6 ms), so it can run on a window of
frames: decoded with :data:`CONTEXT_FRAMES` more frames on each side, a window's samples are the samples
a whole-sentence decode gives there (measured: max |difference| 6e-7 with 16 frames of context, 1.4e-3
with 8). :class:`SplitVoice` cuts the graph at the decoder's first convolution (``/dec/conv_pre/Conv`` in
Piper's exports) into an acoustic part (phoneme ids → latent ``z``) and a decoder part (``z`` → audio), so
the first ~0.3 s of a clause can be played after the acoustic part and one short decode.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime
from onnx.utils import Extractor

DECODER_NODE = "/dec/conv_pre/Conv"
"""The decoder's first node in Piper's VITS exports (piper-tts ``export_onnx``: module ``dec``, the HiFi-GAN
generator, whose ``conv_pre`` reads the latent ``z``); its first input is where the graph is cut."""
CONTEXT_FRAMES = 16
"""Latent frames decoded on each side of a window and dropped (exact to float rounding, see above)."""
FIRST_PIECE_FRAMES = 24
"""Frames of a stream's first piece (~280 ms at 22.05 kHz): the time to first audio is the acoustic part
plus the decode of these frames and their right context (~50 ms on one core)."""
PIECE_FRAMES = 160
"""Most frames decoded per later piece (~1.9 s): most clauses are one piece, so streaming costs extra
context decoding only on the first clause and on long sentences."""


@dataclass
class Piece:
    """Part of an utterance's audio: ``pcm`` float32 ``[samples]`` in [-1, 1] at the voice's rate;
    ``last``: the utterance's final piece."""

    pcm: np.ndarray
    last: bool


class SplitVoice:
    """A Piper ONNX graph as two onnxruntime sessions: acoustic (its own inputs → ``z`` float32
    ``[1, channels, frames]``) and decoder (``z``, plus ``sid`` for multi-speaker voices → audio).

    Args:
        model: the voice's ONNX model.
        options: onnxruntime session options for both parts.

    Raises:
        ValueError: the graph has no :data:`DECODER_NODE` (not a Piper VITS export): use it whole.
    """

    def __init__(self, model: onnx.ModelProto, options: onnxruntime.SessionOptions) -> None:
        node = next((n for n in model.graph.node if n.name == DECODER_NODE), None)
        if node is None:
            raise ValueError(f"no {DECODER_NODE} node: not a Piper VITS graph")
        self.z_name = node.input[0]
        inputs = [i.name for i in model.graph.input]
        outputs = [o.name for o in model.graph.output][:1]
        extractor = Extractor(model)
        acoustic = extractor.extract_model(inputs, [self.z_name])
        decoder_inputs = [self.z_name] + [n for n in inputs if n == "sid"]
        decoder = extractor.extract_model(decoder_inputs, outputs)
        providers = ["CPUExecutionProvider"]
        self.acoustic = onnxruntime.InferenceSession(
            acoustic.SerializeToString(), options, providers=providers
        )
        self.decoder = onnxruntime.InferenceSession(decoder.SerializeToString(), options, providers=providers)
        self.decoder_inputs = [i.name for i in self.decoder.get_inputs()]

    def latents(self, args: dict[str, np.ndarray]) -> np.ndarray:
        """``z`` float32 ``[1, channels, frames]`` of one sentence (``args``: the graph's inputs)."""
        return self.acoustic.run([self.z_name], args)[0]

    def decode(self, z: np.ndarray, start: int, end: int, args: dict[str, np.ndarray]) -> np.ndarray:
        """Samples of latent frames ``[start, end)`` of ``z`` (float32 ``[(end - start) * hop]``), decoded
        with up to :data:`CONTEXT_FRAMES` frames of context on each side."""
        frames = z.shape[2]
        lo, hi = max(0, start - CONTEXT_FRAMES), min(frames, end + CONTEXT_FRAMES)
        feeds = {self.z_name: np.ascontiguousarray(z[:, :, lo:hi])}
        feeds.update({k: args[k] for k in self.decoder_inputs if k != self.z_name})
        audio = self.decoder.run(None, feeds)[0].reshape(-1)
        hop = audio.size // (hi - lo)
        if hop * (hi - lo) != audio.size:
            raise RuntimeError(f"decoder gave {audio.size} samples for {hi - lo} frames")
        return audio[(start - lo) * hop : (end - lo) * hop]

    def pieces(self, sentences: list[dict[str, np.ndarray]], first_frames: int | None) -> Iterator[Piece]:
        """The audio of ``sentences`` (each: the graph's inputs), in order: the first piece holds
        ``first_frames`` latent frames (``None``: each sentence whole), the later ones up to
        :data:`PIECE_FRAMES`. A sentence's acoustic part runs when its first piece is asked for."""
        limit = first_frames
        for i, args in enumerate(sentences):
            z = self.latents(args)
            frames, start = z.shape[2], 0
            while start < frames:
                end = frames if limit is None else min(frames, start + limit)
                pcm = self.decode(z, start, end, args)
                start = end
                limit = None if first_frames is None else PIECE_FRAMES
                yield Piece(pcm, last=i == len(sentences) - 1 and end == frames)
