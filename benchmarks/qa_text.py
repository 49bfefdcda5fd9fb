"""``omniduplex bench qa --text``: the questions of the spoken set typed (or as an ASR heard them) straight
into a cascade's LLM stage, in this process, several at once: the LLM's accuracy per kind of question
without the stage processes' latency, cheap enough to compare every candidate LLM on all 128 questions.

``--heard FILE`` takes the transcripts ``omniduplex bench asr --set qa --json FILE`` wrote (the first ASR in
it, or the one named ``--heard-by``), so the score is the spoken set's through that ASR; without it the
questions' own text is asked. Replies are greedy (temperature 0) by default, the system prompt the cascade's
(:data:`~omniduplex.app.host.pipeline.CASCADE_SYSTEM_PROMPT`), scored by
:func:`~omniduplex.benchmarks.qa.is_right`.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

from omniduplex.benchmarks.qa import is_right, load_questions
from omniduplex.pipeline.messages import Transcript, TurnOptions


def heard_transcripts(path: Path, asr: str | None = None) -> tuple[str, dict[str, str]]:
    """``(asr name, {question text: transcript})`` from a ``bench asr --set qa --json`` file.

    Raises:
        ValueError: the file holds no results, or none of ``asr``.
    """
    data = json.loads(Path(path).read_text())
    if not data:
        raise ValueError(f"{path}: no ASR results")
    name = asr or next(iter(data))
    if name not in data:
        raise ValueError(f"{path}: no results of ASR {name!r} (has {', '.join(data)})")
    return name, {r["question"]: r["transcript"] for r in data[name]["rows"]}


def ask_all(worker, prompts: list[str], opts: TurnOptions, concurrency: int = 8) -> list[str]:
    """Each prompt as one user turn through the LLM stage ``worker``, ``concurrency`` at once; the replies."""
    from omniduplex.benchmarks.tools import run_turns

    turns = {str(i): Transcript(turn=opts, transcript=p) for i, p in enumerate(prompts)}
    got = run_turns(worker, turns, concurrency)
    return [got[str(i)].said for i in range(len(prompts))]


def run_text(
    names: list[str],
    limit: int | None = None,
    max_tokens: int = 48,
    temperature: float = 0.0,
    heard: Path | None = None,
    heard_by: str | None = None,
    json_out: Path | None = None,
    verbose: bool = False,
) -> dict[str, dict]:
    """Ask every question of the set (the first ``limit``) of each model of ``names`` (tier names of
    ``bench tools`` or manifests); print accuracy per kind; returns ``{name: {"summary", "answers"}}``.

    Raises:
        ValueError: a bad ``heard`` file; WeightsError: a model's weights not installed.
    """
    from omniduplex.app.host.pipeline import CASCADE_SAMPLING, CASCADE_SYSTEM_PROMPT
    from omniduplex.benchmarks.tools import llm_worker, resolve

    questions = load_questions()[:limit]
    source = "typed"
    prompts = [q.text for q in questions]
    if heard is not None:
        source, by_text = heard_transcripts(heard, heard_by)
        prompts = [by_text.get(q.text, "") for q in questions]
        source = f"heard by {source}"
    sampling = {**CASCADE_SAMPLING, "max_tokens": max_tokens, "temperature": temperature}
    meta = TurnOptions(system_prompt=CASCADE_SYSTEM_PROMPT, sampling=sampling)
    results = {}
    for name in names:
        label, manifest = resolve(name)
        worker = llm_worker(manifest)
        t0 = time.perf_counter()
        replies = ask_all(worker, prompts, meta)
        wall = time.perf_counter() - t0
        answers = [
            {
                "question": q.text,
                "kind": q.kind,
                "asked": p,
                "reply": r,
                "right": is_right(r, q.answers, q.reject),
            }
            for q, p, r in zip(questions, prompts, replies)
        ]
        if verbose:
            for a in answers:
                print(
                    f"{'ok ' if a['right'] else 'NO '} {a['asked']!r} -> {' '.join(a['reply'].split())[:100]}"
                )
        by_kind = defaultdict(list)
        for a in answers:
            by_kind[a["kind"]].append(a["right"])
        summary = {
            "right": sum(a["right"] for a in answers),
            "asked": len(answers),
            "by_kind": {k: [sum(v), len(v)] for k, v in by_kind.items()},
            "wall_s": wall,
        }
        results[label] = {"summary": summary, "answers": answers}
        del worker
    kinds = sorted({q.kind for q in questions})
    how = f"{len(questions)} questions {source}, temperature {temperature}, ≤{max_tokens} tokens"
    print(f"\nbench qa --text: {how}")
    print(f"| LLM | right | {' | '.join(kinds)} | wall s (c=8) |")
    print("|---" * (len(kinds) + 3) + "|")
    for label, r in results.items():
        s = r["summary"]
        cells = " | ".join("{}/{}".format(*s["by_kind"].get(k, [0, 0])) for k in kinds)
        pct = 100 * s["right"] / max(1, s["asked"])
        print(f"| {label} | {s['right']}/{s['asked']} ({pct:.0f}%) | {cells} | {s['wall_s']:.0f} |")
    if json_out:
        json_out.write_text(json.dumps(results, indent=1))
    return results
