"""benchmarks/bench_attention.py off CUDA, and its target bookkeeping (the GPU run is the device check)."""

import subprocess
import sys

import pytest
import torch

from omniduplex.benchmarks.bench_attention import BATCHES, CONTEXTS, HEADER, _row, targets


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


def case(batch, ctx, graph_ratio, ratio=1.0, gbps=3000.0):
    return dict(batch=batch, context=ctx, graph_ratio=graph_ratio, ratio=ratio, ours_GBps=gbps)


def test_every_cell_of_the_grid_must_meet_the_ratio():
    assert (BATCHES, CONTEXTS) == ((1, 2, 4, 8, 16, 32, 64, 128), (1024, 4096))
    full = [case(b, c, 0.9) for b in BATCHES for c in CONTEXTS]
    got = targets(full)
    assert [t["status"] for t in got] == ["met", "met", "met"]
    assert got[0]["cells"] == 16 and got[2]["cells"] == 1
    full[3] = case(2, 4096, 0.49, ratio=0.3)  # one cell below 0.5 on graphs, and eager
    got = targets(full)
    assert [(t["value"], t["status"]) for t in got[:2]] == [(0.49, "missed"), (0.3, "missed")]
    # a grid cut short by the time budget: the ratios are not met, only missed or not measured
    got = targets([case(1, 1024, 0.8), case(128, 4096, 0.9, gbps=1500.0)])
    assert [t["status"] for t in got] == ["not measured", "not measured", "missed"]
    assert [t["status"] for t in targets([])] == ["not measured"] * 3
    assert targets([case(1, 1024, 0.8)], cells=1)[0]["status"] == "met"


def test_row_marks_the_target_per_cell():
    r = dict(
        case(8, 4096, 0.42, ratio=0.38),
        num_splits=8,
        split_len=512,
        ours_graph_GBps=1700.0,
        sdpa_graph_GBps=4048.0,
        sdpa_GBps=2060.0,
        met=False,
        eager_us=41.5,
        max_abs_err=0.004,
        graph_ok=True,
        sdpa_backend="CUDNN_ATTENTION",
    )
    line = _row(r)
    assert "MISSED" in line and " 8x512 " in line and "1700" in line and "4048" in line
    assert "met" in _row({**r, "met": True, "sdpa_graph_GBps": None}).split()
    assert "CUDA graphs" in HEADER and "eager" in HEADER
