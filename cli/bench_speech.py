"""``omniduplex bench tts`` and ``bench tts-stream``: the speech benchmarks (registered on ``bench`` by
:mod:`omniduplex.cli.bench`; the measurements live in :mod:`omniduplex.benchmarks`)."""

from __future__ import annotations

from pathlib import Path

import typer

from omniduplex.cli.options import PLUGIN_HELP, levels, load_plugins


def bench_tts(
    model: Path | None = typer.Option(
        None, help="A registered TTS family's checkpoint (default: small Qwen3-TTS preset)."
    ),
    concurrency: str = typer.Option("1,16,64", help="Comma-separated concurrent utterance counts."),
    frames: int = typer.Option(50, help="Qwen3-TTS codec frames per utterance (12.5 frames = 1 s)."),
    threads: int | None = typer.Option(
        None, help="torch intra-op threads (default: 1 per stage process; 2 in-process)."
    ),
    processes: bool = typer.Option(
        True,
        "--processes/--in-process",
        help="Qwen3-TTS: talker and codec decoder as two stage processes joined by the relay (the served "
        "graph), or both in this one process.",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
    plugin: list[str] | None = typer.Option(None, "--plugin", help=PLUGIN_HELP),
) -> None:
    """TTFP, RTF, audio-s/s per concurrency, by the family's own benchmark (Qwen3-TTS: talker vs codec; the
    others: their lever on and off; a family declaring none: :mod:`omniduplex.benchmarks.tts_runner`)."""
    from omniduplex.app.host.pipeline import cache_dir
    from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
    from omniduplex.pipeline.speech.registry import family_of, known, resolve

    load_plugins(plugin)
    if model is None:
        model = cache_dir() / "small-qwen3-tts"
        if not (model / "model.safetensors").is_file():
            write_tts_checkpoint(model, "small", 0, "custom_voice")
    counts = levels(concurrency)
    if frames < 1 or min(counts) < 1:
        raise typer.BadParameter("--frames and every --concurrency level must be >= 1")
    family = family_of(model)
    if family is None:
        raise typer.BadParameter(f"--model {model}: not a checkpoint of a registered TTS family ({known()})")
    run = resolve(family.bench or "omniduplex.benchmarks.tts_runner:bench")
    run(model, counts, threads=threads, json_out=json_out, frames=frames, processes=processes)


def bench_tts_stream(
    tts: Path | None = typer.Option(None, help="Qwen3-TTS checkpoint (default: the packaged Piper voice)."),
    rounds: int = typer.Option(3, min=1, help="Rounds of the 4-clause reply (the first warms up)."),
    word_ms: float = typer.Option(30.0, min=0, help="Pause between words, as an LLM writes them (ms)."),
    frames: int = typer.Option(25, min=1, help="Qwen3-TTS: codec frames per clause at most."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """WS /v1/audio/speech/stream: a clause's last text message to its first audio (ms)."""
    from omniduplex.benchmarks.tts_stream import run

    run(tts, rounds, word_ms, frames, json_out)


def bench_serve_sweep(
    graphs: str = typer.Option(
        "qwen3-omni,qwen3-tts", "--graphs", help="Comma-separated: qwen3-omni, qwen3-tts."
    ),
    preset: str = typer.Option(
        "small",
        help="small (random-weight presets, CPU) or real (the published sizes, weightless, built "
        "on the device at load; with --depth on the CPU).",
    ),
    depth: int | None = typer.Option(None, help="real: cap every stack at this many layers (same widths)."),
    omni: Path | None = typer.Option(None, help="Qwen3-Omni checkpoint (overrides --preset)."),
    tts: Path | None = typer.Option(None, help="Qwen3-TTS checkpoint (overrides --preset)."),
    graph: Path | None = typer.Option(None, help="Stage-graph YAML (e.g. deploy/graph-gpu.yaml)."),
    concurrency: str = typer.Option("1,4,8,16,32,64", help="Comma-separated concurrency levels."),
    rounds: int = typer.Option(1, help="Rounds per level."),
    max_tokens: int = typer.Option(16, help="Qwen3-Omni: Thinker text tokens per turn."),
    frames: int = typer.Option(25, help="Codec frames per reply / utterance (12.5 frames = 1 s)."),
    threads: int = typer.Option(1, help="torch intra-op threads per stage process."),
    json_out: Path | None = typer.Option(None, "--json", help="JSON file, rewritten after every row."),
    code2wav_batch: str | None = typer.Option(
        None, help="Qwen3-Omni: Code2Wav turns per batched forward, comma-separated to compare in one run "
        "(e.g. 64,1: batched, then one forward per turn; default: the graph YAML's max_num_seqs).",
    ),
    replicas: str | None = typer.Option(
        None, help="Stage replicas, STAGE=N comma-separated (e.g. talker=2,code2wav=2): N processes of the "
        "stage, each request pinned to the least-loaded one (the YAML's `replicas:`).",
    ),
) -> None:
    """TTFP p50/p90, RTF, audio-s/s, output tok/s and per-stage time of the Qwen3-Omni and Qwen3-TTS graphs
    over a concurrency sweep, beside vLLM-Omni's published figures and the seed's."""
    from omniduplex.benchmarks.serve_sweep import GRAPHS, sweep
    from omniduplex.models.preset_cache import cached_checkpoint
    from omniduplex.models.real_shapes import write_real_dir
    from omniduplex.models.weights import cache_dir

    names = [g.strip() for g in graphs.split(",") if g.strip()]
    bad = [g for g in names if g not in GRAPHS]
    if bad or not names:
        raise typer.BadParameter(f"--graphs: unknown {bad}; choose from {list(GRAPHS)}")
    if preset not in ("small", "real"):
        raise typer.BadParameter("--preset: small or real")
    counts = levels(concurrency)
    if min(counts) < 1 or rounds < 1 or frames < 1 or max_tokens < 1:
        raise typer.BadParameter("--concurrency levels, --rounds, --frames and --max-tokens must be >= 1")
    real = {"qwen3-omni": "qwen3-omni-30b-a3b", "qwen3-tts": "qwen3-tts-12hz-1.7b"}
    batches = levels(code2wav_batch) if code2wav_batch else [None]
    if min(b or 1 for b in batches) < 1:
        raise typer.BadParameter("--code2wav-batch values must be >= 1")
    reps = stage_counts(replicas) if replicas else {}
    results: dict = {}
    for g in names:
        model = omni if g == "qwen3-omni" else tts
        if model is None and preset == "real":
            model = write_real_dir(cache_dir() / "real" / f"{real[g]}-d{depth or 'full'}", real[g], depth)
        elif model is None:
            model = cached_checkpoint(g, "small")
        for b in batches if g == "qwen3-omni" else [None]:
            sweep(
                g, model, counts, rounds, max_tokens, frames, threads, json_out, results,
                graph_yaml=graph, code2wav_batch=b, replicas=reps,
            )


def stage_counts(spec: str) -> dict[str, int]:
    """``"talker=2,code2wav=2"`` → ``{"talker": 2, "code2wav": 2}``.

    Raises:
        typer.BadParameter: not ``STAGE=N`` pairs, an unknown stage, or N < 1."""
    from omniduplex.pipeline.stages.kinds import STAGE_KINDS

    out: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        stage, _, n = part.partition("=")
        if stage not in STAGE_KINDS or not n.isdigit() or int(n) < 1:
            raise typer.BadParameter(
                f"--replicas: {part!r} is not STAGE=N with N >= 1 (stages: {', '.join(STAGE_KINDS)})"
            )
        out[stage] = int(n)
    return out
