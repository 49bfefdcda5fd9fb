"""``omniduplex respond``: answer one spoken turn from a WAV/FLAC file, streaming the transcript."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.audio_io import AudioInputError, load_audio, write_wav
from omniduplex.pipeline.config import load_graph
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.topology import UNIFIED, output_rate, topology_for


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


@dataclass
class TurnOptions:
    """Per-turn options of ``respond``. ``user_text``, ``cfg_scale`` and ``max_audio_frames`` apply to unified
    checkpoints (``max_tokens`` is their text budget), ``talker_max_tokens`` and ``speaker`` to Qwen3-Omni."""

    greedy: bool = False
    max_tokens: int = 64
    talker_max_tokens: int = 128
    speaker: str = "ethan"
    user_text: str | None = None
    cfg_scale: float = 1.0
    max_audio_frames: int = 64

    def meta(self, unified: bool) -> dict:
        """The turn's pipeline meta (see :meth:`Orchestrator.submit`)."""
        if unified:
            return {
                "user_text": self.user_text or "",
                "max_text_tokens": self.max_tokens,
                "max_audio_frames": self.max_audio_frames,
                "cfg_scale": self.cfg_scale,
                "sampling": {"temperature": 0.0 if self.greedy else 0.8},
            }
        sampling = {"max_tokens": self.max_tokens}
        talker = {"max_tokens": self.talker_max_tokens}
        if self.greedy:
            sampling["temperature"] = 0.0
            talker["temperature"] = 0.0
        else:
            sampling.update(temperature=0.7, top_p=0.8, top_k=20)  # Qwen3-Omni model-card defaults
        return {"sampling": sampling, "talker_sampling": talker, "speaker": self.speaker}


def serving_meta(
    max_tokens: int,
    talker_max_tokens: int,
    *,
    ignore_eos: bool = False,
    cfg_scale: float = 1.0,
    speaker: str = "ethan",
) -> dict:
    """Turn meta for a server or benchmark that serves either graph shape: Qwen3-Omni model-card
    sampling for the Thinker, ``max_tokens`` text / ``talker_max_tokens`` codec frames as the budgets of
    both shapes, ``cfg_scale`` for unified checkpoints (see :meth:`Orchestrator.submit`)."""
    return {
        "sampling": {
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "ignore_eos": ignore_eos,
        },
        "talker_sampling": {"max_tokens": talker_max_tokens, "ignore_eos": ignore_eos},
        "speaker": speaker,
        # unified checkpoints: the same budgets, plus CFG
        "max_text_tokens": max_tokens,
        "max_audio_frames": talker_max_tokens,
        "cfg_scale": cfg_scale,
    }


def respond(
    input_path: Path | None,
    output_path: Path,
    model: Path | None,
    graph: Path | None,
    opts: TurnOptions,
    dump_tokens: Path | None = None,
    processes: bool = True,
) -> int:
    """Run one turn; returns the process exit code (0 ok, 2 bad input, 1 pipeline error).

    ``input_path`` may be ``None`` only for a unified checkpoint with ``opts.user_text`` (a text turn).
    """
    pcfg = load_graph(graph, model=str(model) if model else None)
    if pcfg.model is None:
        pcfg.model = str(default_model())
    unified = topology_for(pcfg.model) is UNIFIED
    if input_path is None and not (unified and opts.user_text):
        print("error: --input is required (a spoken question)", file=sys.stderr)
        return 2
    try:
        wav = load_audio(input_path) if input_path is not None else np.zeros(0, np.float32)
    except AudioInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return asyncio.run(_run(pcfg, wav, opts.meta(unified), output_path, dump_tokens, processes))


async def _run(pcfg, wav, meta, output_path, dump_tokens, processes) -> int:
    orch = Orchestrator(
        make_backend(pcfg, processes),
        load_tokenizer(pcfg.model),
        record=dump_tokens is not None,
        output_rate=output_rate(pcfg.model),
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
                write_wav(output_path, samples, orch.output_rate)
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
