"""benchmarks/bench_attention.py off CUDA, and its target bookkeeping (the GPU run is the device check)."""

import subprocess
import sys

import pytest
import torch

from omniduplex.benchmarks.bench_attention import targets


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_refuses_without_cuda_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "omniduplex.benchmarks.bench_attention", "--json", "/nonexistent/x.json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_attention needs CUDA: ")


def test_targets_from_cases():
    def case(batch, ctx, ratio, gbps):
        return dict(batch=batch, context=ctx, ratio=ratio, ours_GBps=gbps)

    got = targets([case(1, 4096, 0.45, 300.0), case(8, 4096, 0.7, 2400.0), case(128, 4096, 0.48, 2100.0)])
    assert [(t["value"], t["status"]) for t in got] == [(0.48, "missed"), (2100.0, "met"), (0.45, "met")]
    statuses = [t["status"] for t in targets([case(32, 1024, 0.9, 1.0)])]
    assert statuses == ["met", "not measured", "not measured"]
