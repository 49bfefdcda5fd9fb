"""Model families by registration (models/registry.py): a family declared once — here a toy one from a
``--plugin`` file, tests/toy_model_family.py — is written by ``init-model --arch``, loaded by
``load_model`` from its own tensor names, and given its graph shape and output rate by pipeline/topology.py,
with nothing else edited; the built-in families go through the same table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_llama_gguf import prefill_logits
from typer.testing import CliRunner

from omniduplex.cli.main import cli
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.registry import load_model, model_families, model_family_of
from omniduplex.pipeline.topology import QWEN3_OMNI, UNIFIED, output_rate, topology_for

TOY = Path(__file__).parent / "toy_model_family.py"


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("toy")
    res = CliRunner().invoke(cli, ["init-model", "--arch", "toy-lm", "--out", str(out), "--plugin", str(TOY)])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output.strip().splitlines()[-1])
    assert info["architecture"] == "ToyLMForCausalLM" and info["total_parameters"] > 0
    return out


def test_init_model_writes_the_registered_toy_family(toy_dir):
    tensors = load_file(str(toy_dir / "model.safetensors"))
    assert tensors and all(name.startswith("toy.") for name in tensors)  # the family's own layout
    again = CliRunner().invoke(
        cli, ["init-model", "--arch", "toy-lm", "--out", str(toy_dir.parent / "again"), "--plugin", str(TOY)]
    )
    assert again.exit_code == 0, again.output
    same = load_file(str(toy_dir.parent / "again" / "model.safetensors"))
    assert all(torch.equal(tensors[k], same[k]) for k in tensors)  # seed 0 both times: byte-identical


def test_load_model_reads_the_toy_family_by_its_tensor_names(toy_dir):
    loaded = load_model(toy_dir)
    assert loaded.architecture == "ToyLMForCausalLM" and loaded.parts == ("thinker",)
    saved = load_file(str(toy_dir / "model.safetensors"))
    got = loaded.thinker.state_dict()
    assert set(saved) == {"toy." + k for k in got}
    assert all(torch.equal(saved["toy." + k], v) for k, v in got.items())
    vocab = json.loads((toy_dir / "config.json").read_text())["vocab"]
    logits = prefill_logits(loaded.thinker, [1, 2, 3])  # a prefill through our engine's paged KV cache
    assert logits.shape == (3, vocab) and torch.isfinite(logits).all() and logits.std() > 0


def test_the_graph_shape_and_output_rate_come_from_the_declaration(toy_dir, tmp_path):
    assert topology_for(toy_dir) is QWEN3_OMNI and output_rate(toy_dir) == 16000
    unified = model_family_of("OmniduplexUnifiedLM")
    assert unified is not None and unified.shape == UNIFIED.name  # the built-ins go through the same table
    assert {"qwen3-omni", "text-lm", "unified", "toy-lm"} <= {f.name for f in model_families()}


def test_an_unregistered_architecture_names_the_registered_ones(toy_dir, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    with pytest.raises(CheckpointError, match="unknown architecture 'MambaForCausalLM'.*ToyLMForCausalLM"):
        load_model(tmp_path)


def test_init_model_names_the_registered_families_for_an_unknown_arch(tmp_path):
    res = CliRunner().invoke(cli, ["init-model", "--arch", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "qwen3-omni" in res.output and "unified" in res.output, res.output


@pytest.mark.parametrize(("arch", "architecture"), [
    ("qwen3-omni", "Qwen3OmniMoeForConditionalGeneration"), ("unified", "OmniduplexUnifiedLM")
])
def test_init_model_writes_the_built_in_families_through_the_registry(tmp_path, arch, architecture):
    res = CliRunner().invoke(cli, ["init-model", "--arch", arch, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["architecture"] == architecture
    assert topology_for(tmp_path).name == model_family_of(architecture).shape
