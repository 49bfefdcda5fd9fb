"""``omniduplex bench tts`` and ``bench tts-stream``: the speech benchmarks (registered on ``bench`` by
:mod:`omniduplex.cli.bench`; the measurements live in :mod:`omniduplex.benchmarks`)."""

from __future__ import annotations

from pathlib import Path

import typer

from omniduplex.cli.options import levels


def bench_tts(
    model: Path | None = typer.Option(
        None, help="Qwen3-TTS, VoxCPM2, Higgs or Fish Speech checkpoint (default: small Qwen3-TTS preset)."
    ),
    concurrency: str = typer.Option("1,16,64", help="Comma-separated concurrent utterance counts."),
    frames: int = typer.Option(50, help="Qwen3-TTS codec frames per utterance (12.5 frames = 1 s)."),
    threads: int | None = typer.Option(
        None, help="torch intra-op threads (default: 1 per stage process; 2 in-process)."
    ),
    processes: bool = typer.Option(
        True,
        "--processes/--in-process",
        help="Talker and codec decoder as two stage processes joined by the relay (the served graph), "
        "or both in this one process.",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """TTFP, RTF, audio-s/s per concurrency: Qwen3-TTS talker vs codec; the others, their lever on and off."""
    from omniduplex.app.host.pipeline import cache_dir
    from omniduplex.benchmarks.tts import run
    from omniduplex.benchmarks.tts_graph import run_processes
    from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint

    if model is None:
        model = cache_dir() / "small-qwen3-tts"
        if not (model / "model.safetensors").is_file():
            write_tts_checkpoint(model, "small", 0, "custom_voice")
    counts = levels(concurrency)
    if frames < 1 or min(counts) < 1:
        raise typer.BadParameter("--frames and every --concurrency level must be >= 1")
    from omniduplex.models.tts_family import QWEN3_TTS, tts_family

    if tts_family(model) not in (QWEN3_TTS, None):  # the family's own benchmark, lever on and off
        from omniduplex.benchmarks.tts_family import run as run_family

        run_family(model, counts, threads or 2, json_out)
        return
    if processes:
        run_processes(model, counts, frames, threads or 1, json_out)
    else:
        run(model, counts, frames, threads or 2, json_out)


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
