"""``omniduplex respond``: answer one spoken turn from a WAV/FLAC file, streaming the transcript."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np

from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.audio_io import AudioInputError, load_audio, write_wav
from omniduplex.pipeline.config import load_graph
from omniduplex.pipeline.orchestrator import Orchestrator


def cache_dir() -> Path:
    """``$OMNIDUPLEX_CACHE`` or ``~/.cache/omniduplex``."""
    return Path(os.environ.get("OMNIDUPLEX_CACHE", Path.home() / ".cache" / "omniduplex"))


def default_model() -> Path:
    """The tiny checkpoint, written on first use (deterministic, so concurrent writers agree)."""
    from omniduplex.models.presets import write_checkpoint

    d = cache_dir() / "tiny"
    if not (d / "model.safetensors").is_file():
        tmp = d.with_name(f"tiny.tmp{os.getpid()}")
        write_checkpoint(tmp, "tiny")
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(d)
        except OSError:  # another process won the race
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return d


def make_backend(pcfg, processes: bool):
    """Stage processes joined by the relay (default), or all stages in this process."""
    if processes:
        from omniduplex.pipeline.process_backend import ProcessBackend

        return ProcessBackend(pcfg)
    from omniduplex.pipeline.graph import build_all
    from omniduplex.pipeline.local_backend import LocalBackend

    return LocalBackend(build_all(pcfg))


def respond(
    input_path: Path,
    output_path: Path,
    model: Path | None,
    graph: Path | None,
    greedy: bool,
    dump_tokens: Path | None,
    max_tokens: int,
    talker_max_tokens: int,
    speaker: str,
    processes: bool = True,
) -> int:
    """Run one turn; returns the process exit code (0 ok, 2 bad input, 1 pipeline error)."""
    try:
        wav = load_audio(input_path)
    except AudioInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pcfg = load_graph(graph, model=str(model) if model else None)
    if pcfg.model is None:
        pcfg.model = str(default_model())
    sampling = {"max_tokens": max_tokens}
    talker = {"max_tokens": talker_max_tokens}
    if greedy:
        sampling["temperature"] = 0.0
        talker["temperature"] = 0.0
    else:
        sampling.update(temperature=0.7, top_p=0.8, top_k=20)  # Qwen3-Omni model-card defaults
    meta = {"sampling": sampling, "talker_sampling": talker, "speaker": speaker}
    return asyncio.run(_run(pcfg, wav, meta, output_path, dump_tokens, processes))


async def _run(pcfg, wav, meta, output_path, dump_tokens, processes) -> int:
    orch = Orchestrator(
        make_backend(pcfg, processes), load_tokenizer(pcfg.model), record=dump_tokens is not None
    )
    await orch.start()
    pcm, code = [], 0
    try:
        rid = orch.submit(wav, meta)
        record = None
        async for ev in orch.events(rid):
            if ev.kind == "text":
                print(ev.text, end="", flush=True)
            elif ev.kind == "audio":
                pcm.append(ev.pcm)
            elif ev.kind == "error":
                print(f"\nerror: {ev.error}", file=sys.stderr)
                code = 1
            elif ev.kind == "done":
                record = orch.turn_record(rid) if dump_tokens else None
                samples = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
                write_wav(output_path, samples)
                m = ev.metrics
                print(
                    f"\n\nTTFP {m['ttfp_ms']:.0f} ms | E2EL {m['e2el_ms']:.0f} ms | RTF {m['rtf']:.3f} | "
                    f"audio {m['audio_s']:.2f} s -> {output_path}"
                )
        if dump_tokens and record is not None:
            Path(dump_tokens).write_text(json.dumps(record))
    finally:
        await orch.stop()
    return code


def respond_unified(
    model_dir: Path,
    input_path: Path | None,
    output_path: Path,
    prompt: str | None,
    greedy: bool,
    max_tokens: int,
    max_audio_frames: int,
    cfg_scale: float,
) -> int:
    """One turn of a unified delay-pattern checkpoint: text then speech, optional CFG; returns the exit code.

    The unified shape has no speech encoder, so it is conditioned on ``prompt`` text; an ``--input``
    WAV is still validated (bad audio → exit 2) and its duration noted.
    """
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.unified_turn import UnifiedTurnRunner

    if input_path is not None:
        try:
            wav = load_audio(input_path)
        except AudioInputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(
            f"(unified checkpoint: no speech input path; {wav.size / 16000:.1f} s of audio noted, "
            f"conditioning on the text prompt)",
            file=sys.stderr,
        )
    model = load_model(model_dir)
    tok = load_tokenizer(model_dir)
    cfg = model.unified.cfg
    text = prompt or "Say hello."
    ids = [cfg.bos_token_id, *tok.encode(f"user: {text}\nassistant: ", add_special_tokens=False).ids]
    runner = UnifiedTurnRunner(model)
    pcm = []
    for ev in runner.run(ids, tok, max_tokens, max_audio_frames, cfg_scale, 0.0 if greedy else 0.8):
        if ev.kind == "text":
            print(ev.text, end="", flush=True)
        elif ev.kind == "audio":
            pcm.append(ev.pcm)
        elif ev.kind == "done":
            samples = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
            write_wav(output_path, samples, runner.rate)
            m = ev.metrics
            print(
                f"\n\nTTFP {m['ttfp_ms']:.0f} ms | E2EL {m['e2el_ms']:.0f} ms | RTF {m['rtf']:.3f} | "
                f"audio {m['audio_s']:.2f} s ({m['frames']} frames, cfg {cfg_scale}) -> {output_path}"
            )
    return 0
