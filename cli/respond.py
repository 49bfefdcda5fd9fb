"""``omniduplex respond``: answer one spoken turn from a WAV/FLAC file through the pipeline (no server, no
session), streaming the transcript and the reply, then TTFP, E2EL and RTF."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np

from omniduplex.app.host.pipeline import RespondOptions, new_orchestrator, resolve_model
from omniduplex.pipeline.audio_io import AudioInputError, load_audio, write_wav
from omniduplex.pipeline.config import load_graph
from omniduplex.pipeline.topology import UNIFIED, topology_for


def respond(
    input_path: Path | None,
    output_path: Path,
    model: Path | None,
    graph: Path | None,
    opts: RespondOptions,
    dump_tokens: Path | None = None,
    processes: bool = True,
    start_timeout_s: float = 180.0,
) -> int:
    """Run one turn; returns the process exit code (0 ok, 2 bad input, 1 pipeline error).

    ``input_path`` may be ``None`` only for a unified checkpoint with ``opts.user_text`` (a text turn).
    ``start_timeout_s``: a stage process not ready after this long is reported late on stderr and waited for
    (a first run builds and imports what later runs find cached; one that fails still ends the run).
    """
    pcfg = load_graph(graph, model=str(model) if model else None)
    pcfg.model = resolve_model(pcfg.model)
    shape = topology_for(pcfg.model)
    unified = shape is UNIFIED
    if input_path is None and not (unified and opts.user_text):
        print("error: --input is required (a spoken question)", file=sys.stderr)
        return 2
    try:
        wav = load_audio(input_path) if input_path is not None else np.zeros(0, np.float32)
    except AudioInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run = _run(pcfg, wav, opts.meta(shape.name), output_path, dump_tokens, processes, start_timeout_s)
    return asyncio.run(run)


async def _run(pcfg, wav, meta, output_path, dump_tokens, processes, start_timeout_s) -> int:
    start = {"start_timeout_s": start_timeout_s, "wait_when_late": True}
    orch = new_orchestrator(pcfg, processes, record=dump_tokens is not None, **start)
    await orch.start()
    pcm, code = [], 0
    try:
        rid = orch.submit(wav, meta)
        record = None
        async for ev in orch.events(rid):
            if ev.kind == "transcript":
                print(f"you: {ev.text or '(no words heard: no reply)'}\nassistant: ", end="", flush=True)
            elif ev.kind == "text":
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
                split = ""
                if "tts_first_chunk_ms" in m:
                    split = (
                        f" (ASR {m['asr_ms']:.0f} + LLM first clause {m['llm_first_clause_ms']:.0f}"
                        f" + TTS first chunk {m['tts_first_chunk_ms']:.0f})"
                    )
                print(
                    f"\n\nTTFP {m['ttfp_ms']:.0f} ms{split} | E2EL {m['e2el_ms']:.0f} ms | "
                    f"RTF {m['rtf']:.3f} | audio {m['audio_s']:.2f} s -> {output_path}"
                )
        if dump_tokens and record is not None:
            Path(dump_tokens).write_text(json.dumps(record))
    finally:
        await orch.stop()
    return code
