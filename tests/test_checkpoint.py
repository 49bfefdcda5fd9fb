"""Checkpoint writing and loading: deterministic presets, sharded layouts, text LMs, and bad checkpoints
that fail at load with an error naming the tensor or file."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model


def _digests(d) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny")


def _copy(src, tmp_path, name="c"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_init_model_cli_is_byte_identical_across_runs(tmp_path, tiny):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        r = subprocess.run(
            [sys.executable, "-m", "omniduplex.cli.main", "init-model", "--preset", "tiny", "--out", str(out)],  # noqa: E501
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
    assert _digests(a) == _digests(b) == _digests(tiny)
    report = json.loads(r.stdout)
    assert report["total_parameters"] == sum(report["parameters"].values()) > 0
    assert set(_digests(a)) == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    }


def test_published_tensor_names_and_per_expert_layout(tiny):
    names = set(load_file(str(tiny / "model.safetensors")))
    assert "thinker.model.layers.0.mlp.experts.3.gate_proj.weight" in names
    assert "talker.model.layers.0.mlp.shared_expert_gate.weight" in names
    assert "talker.code_predictor.lm_head.2.weight" in names
    assert "code2wav.code_embedding.weight" in names
    assert "thinker.audio_tower.conv2d1.weight" in names


def test_sharded_checkpoint_loads_like_single_file(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    tensors = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for fname, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(d / fname))
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    a, b = load_model(tiny), load_model(d)
    for x, y in zip(a.talker.state_dict().values(), b.talker.state_dict().values()):
        assert torch.equal(x, y)


def test_text_only_checkpoint_is_a_thinker(tmp_path):
    d = write_checkpoint(tmp_path / "t", "tiny", text_only=True)
    m = load_model(d)
    assert m.architecture == "Qwen3MoeForCausalLM" and m.talker is None and m.thinker.audio_tower is None


def test_missing_tensor_is_named(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    t = load_file(str(d / "model.safetensors"))
    del t["talker.codec_head.weight"]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'talker\.codec_head\.weight'"):
        load_model(d)


def test_wrong_shape_is_named(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    t = load_file(str(d / "model.safetensors"))
    t["thinker.model.norm.weight"] = torch.ones(3)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"thinker\.model\.norm\.weight.*shape \[3\]"):
        load_model(d)


def test_merged_projections_load_from_the_published_parts(tiny, tmp_path):
    """q/k/v and gate/up are one GEMM each in our layers; the checkpoint keeps the published names."""
    names = set(load_file(str(tiny / "model.safetensors")))
    assert {
        "thinker.model.layers.0.self_attn.k_proj.weight",
        "talker.model.layers.0.mlp.shared_expert.up_proj.weight",
    } <= names
    assert not any("qkv_proj" in n or "shared_expert.gate_up_proj" in n for n in names)
    t = load_file(str(tiny / "model.safetensors"))
    model = load_model(tiny)
    attn = model.thinker.model.layers[1].self_attn
    q, k, v = (t[f"thinker.model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(attn.qkv_proj.weight, torch.cat((q, k, v)))
    shared = model.talker.model.layers[0].mlp.shared_expert
    gate, up = (t[f"talker.model.layers.0.mlp.shared_expert.{n}_proj.weight"] for n in ("gate", "up"))
    assert torch.equal(shared.gate_up_proj.weight, torch.cat((gate, up)))


def test_missing_or_misshapen_part_of_a_merged_projection_is_named(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    t = load_file(str(d / "model.safetensors"))
    k = t.pop("thinker.model.layers.0.self_attn.k_proj.weight")
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"missing tensor 'thinker\.model\.layers\.0\.self_attn\.k_proj\.weight'"
    ):
        load_model(d)
    t["thinker.model.layers.0.self_attn.k_proj.weight"] = k[:-1]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"self_attn\.k_proj\.weight.*has shape \[{k.shape[0] - 1}, "):
        load_model(d)


def test_unknown_architecture(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown architecture 'MistralForCausalLM'"):
        load_model(d)


def test_truncated_safetensors_names_the_file(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated"):
        load_model(d)


def test_missing_shard_names_the_file(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    names = list(load_file(str(d / "model.safetensors")))
    index = {"weight_map": {n: "model-00001-of-00002.safetensors" for n in names}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="shard model-00001-of-00002.safetensors .* missing"):
        load_model(d)


def test_config_that_contradicts_the_weights(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["thinker_config"]["text_config"]["num_hidden_layers"] = 1  # the weights have 2 layers
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"thinker\.model\.layers\.1\..* not part of the model"):
        load_model(d)
    cfg["thinker_config"]["text_config"]["num_hidden_layers"] = 2
    cfg["thinker_config"]["text_config"]["hidden_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        load_model(d)


def test_missing_config_and_bad_json(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        load_model(tmp_path)
