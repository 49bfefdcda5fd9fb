"""The plumbing of ``omniduplex bench engine --device cuda``: its CPU dry run (a transformers-written 2-layer
Qwen3 through our loader, eager and the graph runner's CPU twin) produces every generated token and the JSON
the device check reads; without a GPU, ``--device cuda`` stops with one line."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from omniduplex.benchmarks.engine_device import NEW_TOKENS, run
from omniduplex.cli.bench import bench


def test_dry_run_writes_every_setting_and_the_targets(tmp_path):
    out = tmp_path / "bench.json"
    summary = run(cs=[1, 3], device="cpu", json_out=out, tiny=True, baseline=False, workdir=tmp_path)
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(summary))
    for setting in ("ours eager", "ours CUDA graphs"):
        for c in ("1", "3"):
            row = saved["settings"][setting][c]
            assert row["tokens"] == int(c) * NEW_TOKENS and row["tok_s"] > 0 and row["decode_steps"] > 0
    graphs = saved["settings"]["ours CUDA graphs"]
    assert graphs["1"]["replays"] == graphs["1"]["decode_steps"] and graphs["graph_misses"] == 0
    assert set(saved["targets"]) == {"c1_tok_s", "c128_tok_s", "replay_host_ms_c1"}
    assert saved["targets"]["c128_tok_s"]["met"] is None  # c=128 was not run
    assert saved["model"]["num_hidden_layers"] == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: --device cuda would run")
def test_device_cuda_without_a_gpu_fails_with_one_line():
    result = CliRunner().invoke(bench, ["engine", "--device", "cuda"])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "sees no CUDA GPU" in lines[0]


def test_transformers_baseline_runs_last_and_stops_at_its_budget(tmp_path, capsys):
    summary = run(cs=[1, 2], device="cpu", tiny=True, workdir=tmp_path, baseline_budget_s=0.0)
    assert list(summary["settings"]) == ["ours eager", "ours CUDA graphs", "transformers static+compile"]
    hf = summary["settings"]["transformers static+compile"]
    assert all("budget" in hf[c]["skipped"] for c in ("1", "2"))  # no level started past the cap
    assert summary["settings"]["ours CUDA graphs"]["2"]["tok_s"] > 0  # ours measured all the same
    assert "| 2 |" in capsys.readouterr().out
