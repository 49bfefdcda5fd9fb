"""Moonshine base on stock onnxruntime (real weights from ``moonshine-cpp``, converted once into the cache):
the int8 folding, our tokenizer, transcription, the ASR choice in the manifest."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from speech import words_of

from omniduplex.models.cascade import manifest as cm
from omniduplex.models.cascade.asr import SAMPLE_RATE, WhisperASR, load_asr
from omniduplex.models.cascade.moonshine import (
    MoonshineASR,
    MoonshineError,
    MoonshineTokenizer,
    converted_dir,
    fold_dequantize,
    is_moonshine_dir,
)
from omniduplex.models.weights import locate_moonshine_base, package_dir, packages_dir
from omniduplex.pipeline.audio_io import load_audio

BECKETT_TEXT = "ever tried ever failed no matter try again fail again fail better"
"""``moonshine-cpp``'s ``test-data/beckett.wav`` (real speech, 10 s): Samuel Beckett, Worstward Ho."""


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return locate_moonshine_base()


@pytest.fixture(scope="module")
def asr(model_dir) -> MoonshineASR:
    return MoonshineASR(model_dir, cpu_threads=1)


@pytest.fixture(scope="module")
def beckett(model_dir) -> np.ndarray:
    return load_audio(model_dir.parents[1] / "test-data" / "beckett.wav", SAMPLE_RATE)


def test_fold_dequantize_keeps_the_graph_output(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, (4, 3), dtype=np.int8)
    scale, zero = np.float32(0.02), np.float32(-0.1)
    nodes = [
        helper.make_node("Cast", ["w_q"], ["w_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["w_f", "w_scale"], ["w_m"]),
        helper.make_node("Add", ["w_m", "w_zero"], ["w"]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(q, "w_q"),
            numpy_helper.from_array(np.array(scale), "w_scale"),
            numpy_helper.from_array(np.array(zero), "w_zero"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert fold_dequantize(model) == 3
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert list(inits) == ["w"] and inits["w"].dtype == np.float32  # the int8 copy is gone
    np.testing.assert_allclose(inits["w"], q.astype(np.float32) * scale + zero, rtol=0, atol=0)
    after = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    onnx.checker.check_model(model)


def test_tokenizer_matches_the_reference_tokenizer_json(model_dir):
    root = package_dir("moonshine_onnx")  # useful-moonshine-onnx: its tokenizer.json, an oracle
    assert root is not None, "bash scripts/install.sh test (installs the useful-moonshine-onnx oracle)"
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(root / "assets" / "tokenizer.json"))
    ours = MoonshineTokenizer(model_dir / "tokenizer.bin")
    assert len(ours.pieces) == 32000
    for text in ["Ever tried. Ever failed.", "It's 7:30 — café, naïve; 東京!", "  two  spaces\tand tab"]:
        ids = ref.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == ref.decode(ids), text
    rng = np.random.default_rng(1)
    for _ in range(20):
        ids = rng.integers(3, 32000, 12).tolist()
        assert ours.decode(ids) == ref.decode(ids), ids
    assert ours.decode([1, *ref.encode("Hi there", add_special_tokens=False).ids, 2]) == "Hi there"


def test_truncated_tokenizer_is_a_clear_error(tmp_path, model_dir):
    bad = tmp_path / "tokenizer.bin"
    bad.write_bytes((model_dir / "tokenizer.bin").read_bytes()[:1001])
    with pytest.raises(MoonshineError, match="truncated"):
        MoonshineTokenizer(bad)


def test_transcribes_real_speech(asr, beckett):
    t = asr.transcribe(beckett)
    assert words_of(t.text) == BECKETT_TEXT.split(), t.text
    assert t.duration_s == pytest.approx(beckett.size / SAMPLE_RATE)
    assert t.language == "en" and t.words == []


@pytest.mark.slow
def test_same_tokens_as_the_reference_loader_on_the_shipped_ort(model_dir, beckett, monkeypatch):
    """useful-moonshine-onnx's loader (oracle) on the untouched ``.ort`` files vs our fp32 conversion."""
    if importlib.util.find_spec("moonshine_onnx") is None:  # installed apart (scripts/install.sh)
        monkeypatch.syspath_prepend(str(packages_dir()))
    from moonshine_onnx.model import MoonshineOnnxModel

    ref = MoonshineOnnxModel(models_dir=str(model_dir), model_name="base", model_format="ort")
    clip = beckett[: 4 * SAMPLE_RATE]
    fp32 = MoonshineASR(model_dir, cpu_threads=1, int8_decoder=False, beam=1)  # greedy, as the reference
    assert len(fp32.steps) == 1  # the merged decoder
    assert ref.generate(clip[None])[0][1:-1] == fp32.token_ids(clip)


def test_int8_decoder_gives_the_fp32_decoders_words(asr, model_dir, beckett):
    """The int8 split decoder (the default) against the fp32 merged one on real speech: the same words on
    every 3 s piece of the Beckett clip and on the whole clip."""
    fp32 = MoonshineASR(model_dir, cpu_threads=1, int8_decoder=False)
    assert len(asr.steps) == 2 and len(fp32.steps) == 1
    pieces = [beckett[i : i + 3 * SAMPLE_RATE] for i in range(0, beckett.size - SAMPLE_RATE, 3 * SAMPLE_RATE)]
    for wave in [beckett, *pieces]:
        assert words_of(asr.transcribe(wave).text) == words_of(fp32.transcribe(wave).text)


def test_batch_equals_each_alone_and_silence_gives_nothing(asr, beckett):
    rng = np.random.default_rng(0)
    silence = np.zeros(SAMPLE_RATE, np.float32)
    quiet_noise = (1e-4 * rng.standard_normal(SAMPLE_RATE)).astype(np.float32)
    parts = [beckett[: 3 * SAMPLE_RATE], silence, beckett[3 * SAMPLE_RATE : 6 * SAMPLE_RATE], quiet_noise]
    batch = asr.transcribe_batch(parts)
    alone = [asr.transcribe(p) for p in parts]
    assert [b.text for b in batch] == [a.text for a in alone]
    assert batch[1].text == "" and batch[3].text == ""
    assert words_of(batch[0].text)[:2] == ["ever", "tried"]
    with pytest.raises(ValueError, match="waveform 1"):
        asr.transcribe_batch([beckett, np.zeros((2, 100), np.float32)])


def test_conversion_is_cached_and_atomic(tmp_path, model_dir):
    out = converted_dir(model_dir, tmp_path)
    assert out.parent == tmp_path / "moonshine" and is_moonshine_dir(out)
    assert {p.name for p in out.iterdir()} == {
        "encoder_model.onnx",
        "decoder_model_merged.onnx",
        "decoder_first.int8.onnx",
        "decoder_cached.int8.onnx",
        "tokenizer.bin",
    }
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary folder left behind
    m = onnx.load(str(out / "encoder_model.onnx"), load_external_data=False)
    assert not any(t.data_type == TensorProto.INT8 for t in m.graph.initializer)
    q = onnx.load(str(out / "decoder_cached.int8.onnx"), load_external_data=False)
    weights = {t.name for t in q.graph.initializer if np.prod(t.dims) >= 416 * 416}  # not the rotary table
    weight_matmuls = [n.name for n in q.graph.node if n.op_type == "MatMul" and set(n.input) & weights]
    int8 = sum(n.op_type == "MatMulInteger" for n in q.graph.node)
    assert weight_matmuls == [] and int8 >= 8 * 6 + 1  # every weight MatMul (the tied LM head's too) is int8
    assert not any(i.name == "use_cache_branch" for i in q.graph.input)
    mtime = (out / "decoder_model_merged.onnx").stat().st_mtime_ns
    assert converted_dir(model_dir, tmp_path) == out
    assert (out / "decoder_model_merged.onnx").stat().st_mtime_ns == mtime  # not converted twice
    assert converted_dir(out, tmp_path / "other") == out  # already .onnx: used as is
    with pytest.raises(MoonshineError, match="not a Moonshine folder"):
        converted_dir(tmp_path, tmp_path)


def test_manifest_names_the_asr(tmp_path, model_dir, monkeypatch):
    monkeypatch.setenv("OMNIDUPLEX_CACHE", str(tmp_path / "cache"))
    default = cm.load_manifest(cm.default_manifest(tmp_path / "cache"))
    assert default.asr == cm.asr_path(cm.DEFAULT_ASR).resolve()
    for name in ("whisper-tiny.en", "moonshine-base"):
        doc = {"architecture": "cascade", "asr": name, "llm": str(default.llm), "tts": str(default.tts)}
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(doc))
        m = cm.load_manifest(path)
        assert m.asr == cm.asr_path(name).resolve()
        assert is_moonshine_dir(m.asr) == (name == "moonshine-base")


def test_load_asr_picks_the_model_by_folder(asr, model_dir):
    from omniduplex.models.weights import WHISPER_TINY_EN, locate

    assert isinstance(load_asr(model_dir), MoonshineASR)
    assert isinstance(load_asr(locate(WHISPER_TINY_EN).parent), WhisperASR)
