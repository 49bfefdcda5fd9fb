"""``omniduplex bench asr``: every packaged ASR on the spoken evaluation set (:mod:`.spoken_set`).

Per model, clips interleaved model by model (each sees the same machine load): word error rate (edits /
reference words over :func:`~.spoken_set.words`, so "7" and "seven" agree), the share of clips heard word
for word, the share whose key words were all heard (:func:`~.spoken_set.key_heard`) over all clips, the
clean synthetic voices (espeak-ng and Piper, no channel) and each channel, and the wall time of one
``transcribe`` of the whole clip (p50 / p90 ms; the latency an ASR adds at the end of a turn when it does not
transcribe while the user speaks).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from omniduplex.benchmarks.spoken_set import PIPER, key_heard, words
from omniduplex.benchmarks.wer import edit_distance


def condition(q) -> str:
    """The clip's condition label: ``espeak``, ``piper`` (clean) or its channel (``phone``, ``noise``)."""
    if q.channel != "clean":
        return q.channel
    return "piper" if q.voice == PIPER else "espeak"


def score(text: str, transcript: str) -> tuple[int, int, bool]:
    """``(word edits, reference words, key words heard)`` of one transcript of ``text``."""
    ref = words(text)
    return edit_distance(ref, words(transcript)), len(ref), key_heard(text, transcript)


def summarize(rows: list[dict]) -> dict:
    """Totals of one model's rows (``edits``, ``ref``, ``key``, ``condition``, ``ms``)."""

    def part(rs):
        n = len(rs)
        return {
            "clips": n,
            "wer": sum(r["edits"] for r in rs) / max(1, sum(r["ref"] for r in rs)),
            "exact": sum(r["edits"] == 0 for r in rs) / max(1, n),
            "key_heard": sum(r["key"] for r in rs) / max(1, n),
        }

    out = {"all": part(rows), "clean": part([r for r in rows if r["condition"] in ("espeak", "piper")])}
    for c in ("espeak", "piper", "phone", "noise"):
        out[c] = part([r for r in rows if r["condition"] == c])
    ms = [r["ms"] for r in rows]
    out["ms_p50"], out["ms_p90"] = float(np.percentile(ms, 50)), float(np.percentile(ms, 90))
    return out


def run_set(names: list[str], threads: int, limit: int | None, json_out: Path | None) -> dict:
    """Transcribe the spoken set with each ASR of ``names`` (packaged names or folders); print a row per
    clip and model and a summary table; returns ``{name: {"summary", "rows"}}``."""
    from omniduplex.benchmarks.qa import load_questions, speak
    from omniduplex.models.cascade.asr import SAMPLE_RATE, load_asr
    from omniduplex.models.cascade.manifest import asr_path
    from omniduplex.models.weights import cache_dir
    from omniduplex.pipeline.audio_io import load_audio

    questions = load_questions()[:limit]
    waves = [load_audio(speak(q, cache_dir() / "bench-qa"), SAMPLE_RATE) for q in questions]
    models = {n: load_asr(asr_path(n), cpu_threads=threads) for n in names}
    for asr in models.values():
        asr.transcribe(waves[0])  # warm-up
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for i, (q, w) in enumerate(zip(questions, waves), 1):
        for n, asr in models.items():
            t0 = time.perf_counter()
            hyp = asr.transcribe(w).text.strip()
            ms = 1000 * (time.perf_counter() - t0)
            edits, ref, key = score(q.text, hyp)
            rows[n].append(
                {"question": q.text, "transcript": hyp, "condition": condition(q), "voice": q.voice,
                 "speed": q.speed, "edits": edits, "ref": ref, "key": key, "ms": ms}
            )  # fmt: skip
            cond = condition(q)
            print(f"{i:3d} {n[-20:]:20s} {cond:6s} {ms:6.0f} ms WER {edits}/{ref} key {key:d} | {hyp}")
    results = {n: {"summary": summarize(r), "rows": r} for n, r in rows.items()}
    print(f"\nbench asr: {len(questions)} clips, {threads} thread(s); key heard = every content word heard")
    print(
        "| ASR | WER | word for word | key heard | key heard, clean voices | espeak | Piper | phone", end=""
    )
    print(" | noise | transcribe p50 / p90 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, r in results.items():
        s = r["summary"]
        cells = " | ".join(
            f"{100 * s[c]['key_heard']:.0f}%" if s[c]["clips"] else "-"
            for c in ("espeak", "piper", "phone", "noise")
        )
        print(
            f"| {n} | {100 * s['all']['wer']:.1f}% | {100 * s['all']['exact']:.0f}% | "
            f"{100 * s['all']['key_heard']:.0f}% | {100 * s['clean']['key_heard']:.0f}% | {cells} | "
            f"{s['ms_p50']:.0f} / {s['ms_p90']:.0f} |"
        )
    if json_out:
        json_out.write_text(json.dumps(results, indent=1))
    return results
