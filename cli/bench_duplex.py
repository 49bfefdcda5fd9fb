"""``omniduplex bench duplex`` and ``bench duplex-prompts``: the full-duplex frame engine's benchmarks
(registered on ``bench`` by :mod:`omniduplex.cli.bench`; the measurements live in
:mod:`omniduplex.benchmarks.duplex` and :mod:`omniduplex.benchmarks.duplex_prompts`)."""

from __future__ import annotations

from pathlib import Path

import typer


def bench_duplex(
    model: Path | None = typer.Option(None, help="Moshi folder (default: a random preset)."),
    preset: str = typer.Option("small", help="Random preset when no --model: tiny, small or 7b."),
    sessions: str = typer.Option("1,2,4,6,8", help="Session counts of the tick curve."),
    ticks: int = typer.Option(40, help="Timed ticks per session count."),
    threads: int = typer.Option(1, help="torch intra-op threads (1: the small matmuls do not split well)."),
    full_context: bool = typer.Option(True, help="Attend over the whole context window (steady state)."),
    graphs: str = typer.Option("off", help="off, twin, cuda or auto (CUDA graphs per batch bucket)."),
    dialog_sessions: int = typer.Option(4, help="Sessions in the synthetic-dialog run (0: skip it)."),
    dialog_seconds: float = typer.Option(20.0, help="Length of each synthetic dialog."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    dtype: str = typer.Option(
        "auto", help="LM weights: float32, bfloat16 or auto (bf16 on a GPU or an AMX CPU, else fp32)."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """Full-duplex frame engine: sessions vs tick time p50/p99, underruns, Full-Duplex-Bench measures."""
    from omniduplex.benchmarks.duplex import run

    if dtype not in ("auto", "float32", "bfloat16"):
        raise typer.BadParameter(f"--dtype {dtype!r}: choose auto, float32 or bfloat16")
    counts = [int(x) for x in sessions.split(",") if x.strip()]
    run(
        model,
        preset,
        counts,
        ticks,
        threads,
        full_context,
        graphs,
        dialog_sessions,
        dialog_seconds,
        device,
        dtype,
        json_out,
    )


def bench_duplex_prompts(
    preset: str = typer.Option("small", help="Random preset: tiny, small or 7b."),
    sessions: int = typer.Option(4, help="Steady sessions beside the row that joins with prompts."),
    ticks: int = typer.Option(60, help="Timed ticks of each kind."),
    prompt_frames: int = typer.Option(25, help="Prompt length in 80 ms frames."),
    threads: int = typer.Option(1, help="torch intra-op threads."),
    full_context: bool = typer.Option(True, help="Attend over the whole context window (steady state)."),
) -> None:
    """Voice / role prompt prefill vs the other sessions' tick p50/p99 (prefilling row vs a plain one)."""
    from omniduplex.benchmarks.duplex_prompts import run

    run(preset, sessions, ticks, prompt_frames, threads, full_context)
