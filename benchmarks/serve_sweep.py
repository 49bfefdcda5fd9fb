"""``omniduplex bench serve-sweep``: the Qwen3-Omni and Qwen3-TTS graphs at c = 1 … 64, as vLLM-Omni reports.

Each graph is served as in production (its stages in their own processes joined by the relay, driven through
the orchestrator). At each concurrency ``c``, ``c`` requests start together, ``rounds`` times:

- Qwen3-Omni: spoken turns (``benchmarks/speech/*.wav`` in turn), ``max_tokens`` Thinker tokens and
  ``talker_frames`` codec frames each (``ignore_eos``: fixed-length load);
- Qwen3-TTS: utterances (:data:`.tts.SENTENCES`), ``talker_frames`` codec frames each (``ignore_eos``).

Figures per row: TTFP p50 / p90 (submit → first PCM at the orchestrator, ms), RTF p50 (submit → last PCM over
the audio's duration), audio-s/s (all audio ÷ the level's wall time), output tok/s (Thinker text tokens ÷
wall; Qwen3-TTS: codec frames ÷ wall, :func:`audio_frames`), per stage the busy seconds its gauges report
over the level (``busy_s``: time in the stage's steps; the Qwen3-TTS stages add their own ``*_s``), and the
TTFP split the turns carry (``*_ms`` keys, p50).

The table prints beside the anchors (:data:`ANCHORS`: vLLM-Omni's published tables, the seed figures) and
says which targets of issue 41 (:data:`TARGETS`) a row meets. Every row is written to the JSON file as it
finishes, so a run cut short keeps what it measured. Speed only: random-weight audio is noise.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np

from omniduplex.benchmarks.tts import SENTENCES

GRAPHS = ("qwen3-omni", "qwen3-tts")
ANCHORS: dict[str, list[dict]] = {
    "qwen3-omni": [
        # vLLM blog "qwen3-omni-optimization": c=32, 3 GPUs, graphs, async chunks, 2 Talker/Code2Wav replicas
        {"who": "vLLM-Omni, 3 GPUs", "c": 32, "ttfp_p50_ms": 482, "rtf_p50": 0.31, "tok_s": 186},
    ],
    "qwen3-tts": [
        # vllm-omni benchmarks/tts/README.md, Qwen3-TTS-12Hz-1.7B on one H20 (codec at batch 1, vllm-omni#272)
        {"who": "vLLM-Omni, H20", "c": 1, "ttfp_p50_ms": 165, "rtf_p50": 0.15},
        {"who": "vLLM-Omni, H20", "c": 8, "ttfp_p50_ms": 1701, "rtf_p50": 0.49},
        {"who": "vLLM-Omni, H20", "c": 32, "ttfp_p50_ms": 3772, "rtf_p50": 0.77},
        {"who": "seed, H20 x2", "c": 1, "ttfp_p50_ms": 70.6},
        {"who": "seed, H20 x2", "c": 16, "ttfp_p50_ms": 451},
        {"who": "seed, H20 x2", "c": 64, "audio_s_per_s": 42.9},
    ],
}
"""Published figures the sweep is read against (issue 41)."""
TARGETS: dict[str, dict[int, dict[str, tuple[str, float]]]] = {
    "qwen3-omni": {32: {"ttfp_p50_ms": ("<=", 400), "rtf_p50": ("<=", 0.3)}},
    "qwen3-tts": {
        1: {"ttfp_p50_ms": ("<=", 60)},
        32: {"ttfp_p50_ms": ("<=", 300), "rtf_p50": ("<=", 0.2)},
        64: {"audio_s_per_s": (">=", 100)},
    },
}
"""Issue 41's targets at the real shapes on one GPU: graph → c → figure → (op, bound)."""


def targets_met(graph: str, row: dict) -> dict[str, bool]:
    """``{figure: met}`` for the targets at ``row["c"]`` (empty where none is set)."""
    out = {}
    for key, (op, bound) in TARGETS.get(graph, {}).get(row["c"], {}).items():
        v = row.get(key)
        out[key] = v is not None and (v <= bound if op == "<=" else v >= bound)
    return out


def audio_frames(audio_s: float) -> int:
    """Codec frames of ``audio_s`` seconds of 12 Hz codec audio (12.5 frames/s: 1920 samples at 24 kHz), the
    output tokens of a Qwen3-TTS utterance (its turns carry no text-token count)."""
    return round(audio_s * 12.5)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def _busy(stats: dict) -> dict[str, float]:
    """``{"stage.key": seconds}`` of every cumulative ``*_s`` gauge the stages report."""
    return {
        f"{s}.{k}": float(v)
        for s, g in stats["stages"].items()
        for k, v in g.items()
        if k.endswith("_s") and isinstance(v, (int, float))
    }


async def _one(orch, rid: str) -> dict:
    async for ev in orch.events(rid):
        if ev.kind == "error":
            raise RuntimeError(f"request {rid} failed: {ev.error}")
        if ev.kind == "done":
            return ev.metrics
    raise RuntimeError(f"request {rid} ended without done")


START_TIMEOUT_S = 600.0
"""Time the stage processes have to start (s): loading, packing and warming a graph on a busy shared host can
take minutes, and a sweep is not a readiness check."""
CODEC_COUNTS = ("codec_steps", "codec_forwards", "codec_rows")
"""Cumulative counters of the Code2Wav stage (:class:`~omniduplex.pipeline.stages.vocoder.VocoderWorker`)."""


def _codec_counts(stats: dict) -> dict[str, float]:
    """The counters summed over the Code2Wav stage's replicas (``code2wav``, or ``code2wav@0``, ...)."""
    gs = [g for s, g in stats["stages"].items() if s.partition("@")[0] == "code2wav"]
    return {k: float(sum(g.get(k, 0) for g in gs)) for k in CODEC_COUNTS}


def _codec_ratios(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Over a level: Code2Wav turn-chunks per decoder forward and forwards per step (``nan`` if none)."""
    d, nan = {k: after[k] - before[k] for k in CODEC_COUNTS}, float("nan")
    return {
        "code2wav_rows_per_forward": d["codec_rows"] / d["codec_forwards"] if d["codec_forwards"] else nan,
        "code2wav_forwards_per_step": d["codec_forwards"] / d["codec_steps"] if d["codec_steps"] else nan,
    }


async def _level(orch, backend, submit, c: int, rounds: int, settle_s: float) -> dict:
    before = _busy(backend.stats())
    counts0 = _codec_counts(backend.stats())
    metrics, wall = [], 0.0
    for r in range(rounds):
        t0 = time.perf_counter()
        metrics += await asyncio.gather(*(_one(orch, submit(r * c + i)) for i in range(c)))
        wall += time.perf_counter() - t0
    await asyncio.sleep(settle_s)  # the stages report their gauges about once a second
    after = _busy(backend.stats())
    codec = _codec_ratios(counts0, _codec_counts(backend.stats()))
    audio = sum(m["audio_s"] for m in metrics)
    split = sorted({k for m in metrics for k in m if k.endswith("_ms") and k not in ("ttfp_ms", "e2el_ms")})
    return {
        "c": c,
        "requests": len(metrics),
        "ttfp_p50_ms": _pct([m["ttfp_ms"] for m in metrics], 50),
        "ttfp_p90_ms": _pct([m["ttfp_ms"] for m in metrics], 90),
        "rtf_p50": _pct([m["rtf"] for m in metrics if m["audio_s"]], 50),
        "audio_s_per_s": audio / wall,
        "tok_s": sum(m.get("completion_tokens") or audio_frames(m["audio_s"]) for m in metrics) / wall,
        "wall_s": wall,
        "stage_busy_s": {k: round(after[k] - before.get(k, 0.0), 4) for k in after},
        "ttfp_split_p50_ms": {k: _pct([m[k] for m in metrics if k in m], 50) for k in split},
        **codec,
    }


def sweep(
    graph: str,
    model_dir: Path,
    levels: list[int],
    rounds: int = 1,
    max_tokens: int = 16,
    talker_frames: int = 25,
    threads: int = 1,
    json_out: Path | None = None,
    results: dict | None = None,
    settle_s: float = 1.5,
    graph_yaml: Path | None = None,
    code2wav_batch: int | None = None,
    replicas: dict[str, int] | None = None,
) -> list[dict]:
    """Measure ``graph`` (``"qwen3-omni"`` or ``"qwen3-tts"``) on ``model_dir`` at each level; returns rows.
    ``results`` (``{graph: {...}}``) collects every graph's rows, written to ``json_out`` after each row.
    ``graph_yaml``: the stage-graph YAML (devices, dtypes; e.g. ``deploy/graph-gpu.yaml``; default: the CPU
    one). ``code2wav_batch``: the Code2Wav stage's most turns per batched forward (its ``max_num_seqs``;
    1 = one forward per turn, the batching lever off; default: the YAML's); rows carry it as
    ``code2wav_batch`` and the label says it. ``replicas``: stage → processes of it (``{"talker": 2}``, as
    ``replicas:`` in the YAML; stages not in this graph are ignored); rows carry ``replicas`` (stage → count,
    the replicated stages only) and the label says it.

    Raises:
        ValueError: unknown graph, or ``model_dir`` is not a checkpoint of that graph.
        StageStartError: a stage did not start.
        RuntimeError: a request failed.
    """
    from omniduplex.app.host.pipeline import serving_meta
    from omniduplex.models.tokenizer import load_tokenizer
    from omniduplex.pipeline.audio_io import load_audio
    from omniduplex.pipeline.config import load_graph
    from omniduplex.pipeline.messages import TurnOptions, UtteranceRequest
    from omniduplex.pipeline.orchestrator import Orchestrator
    from omniduplex.pipeline.runtime.process_backend import ProcessBackend

    if graph not in GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; choose from {list(GRAPHS)}")
    pcfg = load_graph(graph_yaml, model=str(model_dir), side_asr=None)
    pcfg.side_asr = None
    topo = pcfg.topology()
    if topo.name != graph:
        raise ValueError(f"{model_dir} serves the {topo.name!r} graph, not {graph!r}")
    for stage in topo.all_stages:  # Code2Wav keeps the YAML's turns per forward (or --code2wav-batch)
        update = {"torch_threads": threads}
        if stage != "code2wav":
            update["max_num_seqs"] = max(64, max(levels))
        pcfg.stages[stage] = pcfg.stage(stage).model_copy(update=update)
    label = graph
    if code2wav_batch is not None and graph == "qwen3-omni":
        if code2wav_batch < 1:
            raise ValueError(f"code2wav_batch must be >= 1, got {code2wav_batch}")
        pcfg.stages["code2wav"] = pcfg.stage("code2wav").model_copy(update={"max_num_seqs": code2wav_batch})
        label = f"{graph} c2w-batch {code2wav_batch}"
    for stage, n in (replicas or {}).items():
        if stage in topo.all_stages:
            pcfg.stages[stage] = pcfg.stage(stage).model_copy(update={"replicas": n})
    replicated = {s: pcfg.stage(s).replicas for s in topo.all_stages if pcfg.stage(s).replicas > 1}
    if replicated:
        label += " " + ",".join(f"{s}={n}" for s, n in replicated.items())
    results = {} if results is None else results
    entry = results.setdefault(graph, {"model": str(model_dir), "anchors": ANCHORS[graph], "rows": []})
    if graph == "qwen3-tts":
        from omniduplex.models.checkpoint import read_config
        from omniduplex.models.qwen3_tts.config import TTSConfig

        cfg = TTSConfig.from_dict(read_config(model_dir))
        speakers = sorted(cfg.speakers) if cfg.variant == "custom_voice" else [None]
        sampling = {"max_tokens": talker_frames + 1, "ignore_eos": True}

        def submit(i: int) -> str:
            voice = TurnOptions(voice=speakers[i % len(speakers)], sampling={**sampling, "seed": i})
            return orch.speak(UtteranceRequest(turn=voice, text=SENTENCES[i % len(SENTENCES)]))

        tokenizer = None
    else:
        wavs = [load_audio(p) for p in sorted((Path(__file__).parent / "speech").glob("*.wav"))]
        meta = serving_meta(max_tokens, talker_frames, ignore_eos=True, shape=graph)

        def submit(i: int) -> str:
            return orch.submit(wavs[i % len(wavs)], meta)

        tokenizer = load_tokenizer(model_dir)

    async def main() -> None:
        nonlocal orch
        backend = ProcessBackend(pcfg, start_timeout_s=START_TIMEOUT_S)
        orch = Orchestrator(backend, tokenizer, output_rate=24000)
        await orch.start()
        try:
            await _one(orch, submit(0))  # warm-up: first-use allocations, lazy imports
            for c in levels:
                row = await _level(orch, backend, submit, c, rounds, settle_s)
                row["targets_met"] = targets_met(graph, row)
                if graph == "qwen3-omni":
                    row["code2wav_batch"] = pcfg.stage("code2wav").max_num_seqs
                row["replicas"] = replicated
                entry["rows"].append(row)
                print(_row_line(label, row), flush=True)
                if json_out:
                    json_out.write_text(json.dumps(results, indent=2))
        finally:
            await orch.stop()

    orch = None
    print(f"\n{graph} graph: {model_dir}, stage processes, {threads} torch thread(s) each, {rounds} round(s)")
    print(HEADER)
    asyncio.run(main())
    print_anchors(graph)
    return entry["rows"]


HEADER = (
    "| graph | c | TTFP p50 ms | TTFP p90 ms | RTF p50 | audio-s/s | tok/s | stage busy s | c2w rows/fwd "
    "| targets |\n|---|---|---|---|---|---|---|---|---|---|"
)


def _row_line(graph: str, r: dict) -> str:
    busy = ", ".join(f"{k} {v:.2f}" for k, v in r["stage_busy_s"].items()) or "-"
    met = ", ".join(f"{k} {'met' if ok else 'missed'}" for k, ok in r["targets_met"].items()) or "-"
    return (
        f"| {graph} | {r['c']} | {r['ttfp_p50_ms']:.0f} | {r['ttfp_p90_ms']:.0f} | {r['rtf_p50']:.2f} "
        f"| {r['audio_s_per_s']:.2f} | {r['tok_s']:.1f} | {busy} "
        f"| {r['code2wav_rows_per_forward']:.2f} | {met} |"
    )


def print_anchors(graph: str) -> None:
    """The anchors' rows of ``graph`` in the table's columns."""
    for a in ANCHORS[graph]:
        cols = [f"{a[k]:g}" if k in a else "-" for k in ("ttfp_p50_ms", "rtf_p50", "audio_s_per_s", "tok_s")]
        print(f"| {a['who']} | {a['c']} | {cols[0]} | - | {' | '.join(cols[1:])} | - | - | anchor |")
