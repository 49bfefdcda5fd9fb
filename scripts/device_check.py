"""Helper of ``scripts/device_check.sh`` (one round of GPU checks, issue 33): two subcommands.

``shapes --json PATH``: every graph shape (Qwen3-Omni, unified, Qwen3-TTS; the ``small`` presets) through
``deploy/graph-gpu.yaml`` on CUDA, side ASR off, in-process and in stage processes. Per run: the pipeline's
start-up time, one warm-up turn, then ``--turns`` turns one at a time (c=1); TTFP (turn submitted → first
audio at the orchestrator, ms), E2EL and RTF from each turn's ``done`` metrics, p50 reported. The JSON is
rewritten after every run, so a run cut short by its time budget keeps what was measured. Exit 3 with one
line when CUDA is absent; 1 when a run failed.

``summary --out DIR --work WORK``: ``DIR/summary.json`` from the parts' status lines (``WORK/parts.tsv``:
``name rc seconds timeout_s note``, tab-separated), their output (``WORK/NAME.out``), the versions
(``WORK/env.json``), the pytest JUnit files and the benchmarks' JSON files in ``DIR``; then prints the
table of parts (printed last: the device tool returns only the end of the output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_GRAPH = ROOT / "deploy" / "graph-gpu.yaml"
QUESTION = ROOT / "examples" / "question.wav"
SHAPES = (("qwen3-omni", "small"), ("unified", "small"), ("qwen3-tts", "small"))
TTFP_TARGET_MS = {"qwen3-omni": 50.0}
"""Issue 33's target: Qwen3-Omni small on graph-gpu.yaml, TTFP <= 50 ms at c=1."""
TURN_TIMEOUT_S = 60.0


def _p50(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


async def _turn(orch, start) -> dict:
    rid = start(orch)
    async for ev in orch.events(rid):
        if ev.kind == "error":
            raise RuntimeError(ev.error)
        if ev.kind == "done":
            return ev.metrics
    raise RuntimeError(f"turn {rid} ended without done")


def _one_run(arch: str, preset: str, processes: bool, turns: int) -> dict:
    """Start the graph of one shape, warm up, measure ``turns`` turns; the row of the JSON."""
    from omniduplex.app.host.pipeline import make_backend, serving_meta
    from omniduplex.models.checkpoint import read_config
    from omniduplex.models.preset_cache import cached_checkpoint
    from omniduplex.models.qwen3_tts.config import TTSConfig
    from omniduplex.models.tokenizer import load_tokenizer
    from omniduplex.pipeline.audio_io import load_audio
    from omniduplex.pipeline.config import load_graph
    from omniduplex.pipeline.messages import TurnOptions, UtteranceRequest
    from omniduplex.pipeline.orchestrator import Orchestrator
    from omniduplex.pipeline.topology import QWEN3_TTS, output_rate

    row = {"shape": arch, "preset": preset, "mode": "processes" if processes else "in-process"}
    model = cached_checkpoint(arch, preset)
    pcfg = load_graph(GPU_GRAPH, model=str(model))
    pcfg.side_asr = None
    tts = pcfg.topology() is QWEN3_TTS
    if tts:
        cfg = TTSConfig.from_dict(read_config(model))
        voice = TurnOptions(voice=sorted(cfg.speakers)[0], sampling={"max_tokens": 26, "ignore_eos": True})

        def start(o):
            return o.speak(UtteranceRequest(text="Hello there, how are you today?", turn=voice))
    else:
        meta = serving_meta(16, 32, shape=pcfg.topology().name)
        wav = load_audio(QUESTION)

        def start(o):
            return o.submit(wav, meta)

    t0 = time.perf_counter()
    backend = make_backend(pcfg, processes)
    orch = Orchestrator(backend, None if tts else load_tokenizer(model), output_rate=output_rate(model))

    async def main() -> list[dict]:
        await orch.start()
        row["startup_s"] = round(time.perf_counter() - t0, 1)
        try:
            await asyncio.wait_for(_turn(orch, start), TURN_TIMEOUT_S)  # warm-up
            return [await asyncio.wait_for(_turn(orch, start), TURN_TIMEOUT_S) for _ in range(turns)]
        finally:
            await orch.stop()

    done = asyncio.run(main())
    ttfp = [m["ttfp_ms"] for m in done]
    row.update(
        ok=True,
        turns=len(done),
        ttfp_ms=[round(x, 1) for x in ttfp],
        ttfp_p50_ms=_p50(ttfp),
        e2el_p50_ms=_p50([m["e2el_ms"] for m in done]),
        rtf_p50=_p50([m["rtf"] for m in done if m["audio_s"]]),
        audio_s_p50=_p50([m["audio_s"] for m in done]),
    )
    if arch in TTFP_TARGET_MS:
        row["ttfp_target_ms"] = TTFP_TARGET_MS[arch]
        row["ttfp_target_met"] = row["ttfp_p50_ms"] <= TTFP_TARGET_MS[arch]
    return row


def shapes(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("shapes: CUDA required (torch.cuda.is_available() is False): no shape was run")
        return 3
    rows: list[dict] = []
    failed = False
    for processes in (False, True):  # in-process first: cheaper, and it names a broken stage directly
        for arch, preset in SHAPES:
            t0 = time.perf_counter()
            try:
                row = _one_run(arch, preset, processes, args.turns)
            except Exception as e:  # one broken shape must not hide the others
                failed = True
                row = {
                    "shape": arch,
                    "preset": preset,
                    "mode": "processes" if processes else "in-process",
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}"[:2000],
                }
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            args.json.write_text(json.dumps({"graph": str(GPU_GRAPH), "rows": rows}, indent=2))
    print("| shape | mode | TTFP p50 ms | E2EL p50 ms | RTF p50 | start s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        fig = (
            f"{r['ttfp_p50_ms']} | {r['e2el_p50_ms']} | {r['rtf_p50']}"
            if r.get("ok")
            else f"FAILED: {r['error'][:80]} | |"
        )
        print(f"| {r['shape']}-{r['preset']} | {r['mode']} | {fig} | {r.get('startup_s', '')} |")
    return 1 if failed else 0


def _junit(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return {"error": f"unreadable JUnit file: {e}"}
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    out["failed"] = [
        f"{c.get('classname')}::{c.get('name')}"
        for s in suites
        for c in s.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ][:20]
    reasons = {
        (sk.get("message") or "")[:160]
        for s in suites
        for c in s.iter("testcase")
        for sk in c.findall("skipped")
    }
    out["skip_reasons"] = sorted(reasons)[:10]
    return out


def _json_file(path: Path, limit: int = 200_000):
    if not path.is_file():
        return None
    text = path.read_text()
    if len(text) > limit:
        return {"note": f"{path.name}: {len(text)} bytes, not inlined"}
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return {"error": f"{path.name}: {e}"}


def summary(args) -> int:
    out, work = args.out, args.work
    parts = []
    for line in (work / "parts.tsv").read_text().splitlines():
        name, rc, seconds, timeout_s, note = (line.split("\t") + [""] * 5)[:5]
        tail_file = work / f"{name}.out"
        tail = tail_file.read_text(errors="replace").splitlines()[-25:] if tail_file.is_file() else []
        rc_i = int(rc) if rc.lstrip("-").isdigit() else None
        status = note or ("ok" if rc_i == 0 else "timeout" if rc_i in (124, 137) else f"failed (rc {rc})")
        parts.append(
            {
                "part": name,
                "rc": rc_i,
                "status": status,
                "seconds": float(seconds or 0),
                "timeout_s": int(timeout_s or 0),
                "tail": tail,
            }
        )
    by_name = {p["part"]: p for p in parts}
    for name in ("gpu_tests", "triton_tests"):
        j = _junit(out / f"{name}.xml") if name in by_name else None
        if j:
            by_name[name]["junit"] = j
            if by_name[name]["rc"] == 0 and j.get("tests") and j["skipped"] == j["tests"]:
                by_name[name]["status"] = "all skipped"
    for name, file in (
        ("attention", "attention"),
        ("engine", "engine"),
        ("shapes", "shapes"),
        ("real_shapes", "real"),
        ("sweep", "sweep"),
    ):
        if name in by_name:
            by_name[name]["result"] = _json_file(out / f"{file}.json")
            by_name[name]["targets"] = _targets(name, by_name[name]["result"])
    env = _json_file(work / "env.json") or {}
    doc = {"check": "scripts/device_check.sh (issues 33, 41)", "env": env, "parts": parts}
    (out / "summary.json").write_text(json.dumps(doc, indent=2))
    print(f"\n==== device check summary ({out / 'summary.json'}) ====")
    if env:
        print(" | ".join(f"{k} {v}" for k, v in env.items()))
    print("| part | status | s | key figures |")
    print("|---|---|---|---|")
    for p in parts:
        print(f"| {p['part']} | {p['status']} | {p['seconds']:.0f} | {_figures(p)} |")
    met = {f"{p['part']} {k}": v for p in parts for k, v in (p.get("targets") or {}).items()}
    if met:
        print("targets: " + "; ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()))
    return 0


def _lever(row: dict) -> str:
    """`` c2w=N`` for a Qwen3-Omni sweep row (Code2Wav turns per forward: 1 = the batching lever off)."""
    return f" c2w={row['code2wav_batch']}" if "code2wav_batch" in row else ""


def _targets(part: str, r) -> dict[str, bool]:
    """``{target: met}`` a part's JSON records: the engine's (issue 33), the decode kernel's and the sweep's
    rows (issue 41)."""
    if not isinstance(r, dict):
        return {}
    if part == "engine":
        return {k: t["met"] for k, t in (r.get("targets") or {}).items() if t.get("met") is not None}
    if part == "attention":  # a list of {name, status}; "not measured" rows are left out
        rows = r.get("targets") or []
        return {t["name"]: t["status"] == "met" for t in rows if t["status"] != "not measured"}
    if part == "sweep":
        return {
            f"{g} c={row['c']}{_lever(row)} {k}": ok
            for g, e in r.items()
            if isinstance(e, dict)
            for row in e.get("rows", [])
            for k, ok in row.get("targets_met", {}).items()
        }
    return {}


def _figures(p: dict) -> str:
    """One cell of key figures: test counts, the shapes' TTFP, else the part's last output line."""
    j = p.get("junit")
    if j and "tests" in j:
        s = f"{j['tests']} tests, {j['failures'] + j['errors']} failed, {j['skipped']} skipped"
        if j["failed"]:
            s += ": " + ", ".join(f.rsplit("::", 1)[-1] for f in j["failed"][:4])
        elif j["skipped"] and j["skip_reasons"]:
            s += f" ({j['skip_reasons'][0]})"
        return s
    r = p.get("result")
    if p["part"] == "shapes" and isinstance(r, dict) and r.get("rows"):
        cells = []
        for row in r["rows"]:
            ttfp = f"{row['ttfp_p50_ms']} ms" if row.get("ok") else "FAILED"
            cells.append(f"{row['shape']} {row['mode']} TTFP p50 {ttfp}")
        return "; ".join(cells)
    if p["part"] == "sweep" and isinstance(r, dict):
        return "; ".join(
            f"{g} c={row['c']}{_lever(row)} TTFP p50 {row['ttfp_p50_ms']:.0f} ms RTF {row['rtf_p50']:.2f} "
            f"{row['audio_s_per_s']:.1f} audio-s/s"
            for g, e in r.items()
            if isinstance(e, dict)
            for row in e.get("rows", [])
        )
    if p["part"] == "real_shapes" and isinstance(r, dict):
        return "; ".join(
            f"{row['preset']} "
            + (
                row["error"][:60]
                if "error" in row
                else f"{row['build_s']} s {row.get('allocated_gib', '?')} GiB {row.get('tok_s', '')}"
            )
            for row in r.get("rows", [])
        )
    last = [ln.strip() for ln in p["tail"] if ln.strip()]
    line = last[-1][:200] if last else ""
    return "" if p["status"] in line else line.replace("|", "/")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shapes", help="every shape on graph-gpu.yaml with TTFP")
    s.add_argument("--json", type=Path, required=True)
    s.add_argument("--turns", type=int, default=4, help="measured turns per run, after one warm-up")
    m = sub.add_parser("summary", help="summary.json and the final table")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--work", type=Path, required=True, help="the parts' status lines and output")
    args = ap.parse_args()
    return shapes(args) if args.cmd == "shapes" else summary(args)


if __name__ == "__main__":
    sys.exit(main())
