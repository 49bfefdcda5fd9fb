"""Moonshine's model folder: what it holds, and the one-time conversion of the packaged ``.ort`` files into
``.onnx`` graphs with plain fp32 weights plus the int8 two-branch decoder (why and what it gains:
:mod:`.moonshine`), cached per content under ``<cache>/moonshine/``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from omniduplex.kernels.once import one_time_step

ENCODER = "encoder_model"
DECODER = "decoder_model_merged"
TOKENIZER = "tokenizer.bin"
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
