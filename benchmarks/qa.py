"""``omniduplex bench qa``: are the answers right, and how soon are they spoken?

A set of spoken factual questions with known short answers (:file:`qa_questions.yaml`, ≥ 20, written for
this project) is spoken by espeak-ng in varied voices, speeds and pitches (generated at run time into the
cache), and each question is sent as one spoken turn through the stage processes of a cascade manifest,
one turn at a time (c = 1), after a warm-up turn. Per turn we keep the ASR transcript, the reply text,
whether the reply is right (:func:`is_right`), and the pipeline's TTFP (turn submitted at end of speech →
first PCM chunk) with its cascade split (ASR compute, LLM prefill + first clause, TTS first chunk; see
:meth:`~omniduplex.pipeline.turn_state.TurnState.split_ttfp`). Printed per manifest: accuracy, the
transcripts' word error rate, TTFP p50/p90 and the split's p50/p90. Replies are greedy by
default, so a rerun scores the same.

By default each question is fed to the ASR stage while it is "spoken" (real-time pace, 400 ms pieces, then
the 0.5 s of silence a session feeds while it detects the end of turn), as a session does
(:mod:`omniduplex.app.core.live_asr`); ``--whole`` sends each turn whole at its end instead.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

from omniduplex.benchmarks.spoken_set import CHANNELS, render, words
from omniduplex.benchmarks.wer import edit_distance
from omniduplex.pipeline.messages import Prefill, TurnOptions

__all__ = ["words"]  # re-exported: the scoring words (spelled numbers as digits)

QUESTIONS = Path(__file__).with_name("qa_questions.yaml")
SPLIT = ("asr_ms", "asr_wall_ms", "llm_first_clause_ms", "tts_first_chunk_ms")


@dataclass(frozen=True)
class Question:
    """One spoken question: ``text``, the accepted forms of its answer (``answers``, any one right), forms
    that make a reply wrong even beside an accepted one (``reject``), its ``kind`` (fact, arithmetic, common
    sense, instruction, small talk), and how it is spoken (:func:`~.spoken_set.render`): ``voice``
    (espeak-ng ``-v`` or ``piper``), ``speed`` (words per minute), ``pitch`` (0–99, espeak-ng ``-p``) and
    ``channel`` (clean, phone, noise)."""

    text: str
    answers: tuple[str, ...]
    voice: str = "en-us"
    speed: int = 160
    pitch: int = 50
    kind: str = "fact"
    reject: tuple[str, ...] = ()
    channel: str = "clean"


@dataclass
class Answer:
    """What one turn gave: the ASR ``transcript``, the ``reply`` text, ``right`` (:func:`is_right`), the
    transcript's word error rate against the question (``wer``), and the pipeline ``metrics`` (ms: TTFP,
    E2EL and the cascade split; ``None`` when the turn failed, with ``error`` set)."""

    question: str
    transcript: str
    reply: str
    right: bool
    wer: float
    metrics: dict | None
    error: str | None = None


# -- scoring --------------------------------------------------------------------------------------------
def is_right(reply: str, answers: tuple[str, ...] | list[str], reject: tuple | list = ()) -> bool:
    """``True`` when one of the accepted ``answers`` occurs in ``reply`` as whole words, in order, case and
    punctuation ignored, numbers compared as digits (``"5"`` matches "It is five." but not "56";
    ``"carbon dioxide"`` matches "Carbon-dioxide!"), and none of the ``reject`` forms does (the wrong answer
    a model names beside the right one: "the elephant, or the blue whale").

    Raises:
        ValueError: no accepted answer, or one with no words.
    """
    if not answers:
        raise ValueError("a question needs at least one accepted answer")
    got = words(reply)
    if any(_contains(got, words(form)) for form in reject):
        return False
    for form in answers:
        want = words(form)
        if not want:
            raise ValueError(f"accepted answer {form!r} has no words")
        if _contains(got, want):
            return True
    return False


def _contains(got: list[str], want: list[str]) -> bool:
    n = len(want)
    return n > 0 and any(got[i : i + n] == want for i in range(len(got) - n + 1))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate over :func:`words` (numbers normalised as for answer matching)."""
    ref = words(reference)
    return edit_distance(ref, words(hypothesis)) / max(1, len(ref))


def load_questions(path: Path = QUESTIONS) -> list[Question]:
    """The questions of ``path`` (YAML: ``questions: [{text, answers, reject, kind, voice, speed, pitch,
    channel, echo_ok}, ...]``; see :class:`Question`).

    Raises:
        ValueError: a question with no text or no answers, one whose accepted answer occurs in its own
            text (an echo of the question would score right) unless it says ``echo_ok: true`` (a farewell:
            "Goodbye!" answers "Goodbye!"), or an unknown channel, naming the question.
    """
    out = []
    for i, q in enumerate(yaml.safe_load(Path(path).read_text())["questions"]):
        text, answers = str(q.get("text", "")).strip(), tuple(str(a) for a in q.get("answers") or ())
        if not text or not answers:
            raise ValueError(f"{path}: question {i + 1} needs a text and at least one answer")
        if is_right(text, answers) and not q.get("echo_ok"):
            raise ValueError(f"{path}: question {i + 1} ({text!r}) contains its own answer")
        if q.get("channel", "clean") not in CHANNELS:
            raise ValueError(f"{path}: question {i + 1}: channel {q['channel']!r} is not one of {CHANNELS}")
        keys = {k: q[k] for k in ("voice", "speed", "pitch", "kind", "channel") if k in q}
        out.append(Question(text, answers, reject=tuple(str(a) for a in q.get("reject") or ()), **keys))
    return out


# -- speech ----------------------------------------------------------------------------------------------
def speak(q: Question, cache: Path) -> Path:
    """``q`` spoken as its settings say (:func:`~.spoken_set.render`: espeak-ng or Piper, clean, phone band
    or noise), 16 kHz mono 16-bit, 0.3 s of silence before and after; cached under ``cache``.

    Raises:
        RuntimeError: espeak-ng or sox is missing (scripts/install.sh installs both), or either failed.
    """
    return render(q.text, q.voice, q.speed, q.pitch, q.channel, cache)


# -- running ---------------------------------------------------------------------------------------------
LIVE_PIECE_S = 0.4
"""Live mode: the session's feed period (:data:`omniduplex.app.core.live_asr.FEED_MS`, s)."""
ENDPOINT_S = 0.5
"""Live mode: the silence after the question while the end of turn is detected (``TurnConfig.endpoint_ms``
default, s); fed too, as the session feeds it."""
_live_ids = itertools.count(1)


async def feed_live(orch, wav: np.ndarray, prefill: Prefill | None = None) -> str:
    """Feed ``wav`` (16 kHz) and :data:`ENDPOINT_S` of silence to ``orch`` as a session would while the user
    speaks (real-time pace): a :data:`LIVE_PIECE_S` piece once that much audio has been spoken, and what is
    new when the pause after the question begins (100 ms in, ``app.core.live_asr.PAUSE_FRAMES``); ``prefill``
    (``{system_prompt, history}``) goes with the first piece, so the LLM prefills while the user speaks.
    Returns the turn id to submit at the end of the silence (the end of turn; the rest of the silence goes
    with it)."""
    rid = f"qa-live-{next(_live_ids)}"
    audio = np.concatenate([wav, np.zeros(int(ENDPOINT_S * 16000), np.float32)])
    n, t0 = int(LIVE_PIECE_S * 16000), time.perf_counter()
    cuts = [*range(n, wav.size, n), wav.size + 1600]
    for start, end in zip([0, *cuts], cuts):
        await asyncio.sleep(max(0.0, t0 + end / 16000 - time.perf_counter()))
        orch.feed(rid, audio[start:end], prefill=prefill if start == 0 else None)
    await asyncio.sleep(max(0.0, t0 + audio.size / 16000 - time.perf_counter()))
    return rid


async def ask(
    orch, q: Question, wav: np.ndarray, meta: TurnOptions, live: bool = False, prefill: bool = False
) -> Answer:
    """One spoken turn through ``orch`` (started); returns what it gave and whether it is right. ``live``:
    fed while spoken (:func:`feed_live`; with ``prefill``, the LLM prefills the system prompt and the words
    heard meanwhile), then submitted with 0.1 s of trailing silence (what a session commits); TTFP counts
    from the submit either way."""
    if live:
        context = Prefill(system_prompt=meta.system_prompt or "", history=meta.history or [])
        rid = await feed_live(orch, wav, context if prefill else None)
        silence = np.zeros(int(ENDPOINT_S * 16000), np.float32)
        orch.submit(np.concatenate([wav, silence]), meta, request_id=rid)
    else:
        rid = orch.submit(wav, meta)
    transcript, reply, metrics, error = "", "", None, None
    async for ev in orch.events(rid):
        if ev.kind == "transcript":
            transcript = ev.text or ""
        elif ev.kind == "text":
            reply += ev.text
        elif ev.kind == "done":
            metrics = dict(ev.metrics)
        elif ev.kind == "error":
            error = str(ev.error)
    right = is_right(reply, q.answers, q.reject)
    return Answer(q.text, transcript, reply, right, wer(q.text, transcript), metrics, error)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def summarize(answers: list[Answer]) -> dict:
    """Accuracy (right ÷ asked; a failed turn counts wrong), mean transcript WER, the accuracy on the
    questions the ASR heard (WER ≤ 0.1: separates LLM errors from ASR errors), and p50/p90 (ms) of TTFP
    and of each cascade split over the turns that finished."""
    done = [a.metrics for a in answers if a.metrics is not None]
    out = {
        "asked": len(answers),
        "right": sum(a.right for a in answers),
        "accuracy": sum(a.right for a in answers) / len(answers) if answers else float("nan"),
        "errors": sum(a.error is not None for a in answers),
        "asr_wer": float(np.mean([a.wer for a in answers])) if answers else float("nan"),
        "heard": sum(a.wer <= 0.1 for a in answers),
        "right_when_heard": sum(a.right for a in answers if a.wer <= 0.1),
    }
    for key in ("ttfp_ms", *SPLIT):
        xs = [m[key] for m in done if key in m]
        out[f"{key}_p50"], out[f"{key}_p90"] = _pct(xs, 50), _pct(xs, 90)
    return out


def run_manifest(
    model: str,
    questions: list[Question],
    wavs: list[np.ndarray],
    meta: TurnOptions,
    processes: bool = True,
    verbose: bool = True,
    live: bool = False,
    prefill: bool = False,
) -> list[Answer]:
    """Every question through the stages of ``model`` (stage processes, or all in this process; one
    orchestrator, started and stopped here), after one warm-up turn (not counted); with ``verbose``, a
    table row is printed as each answer arrives."""
    from omniduplex.app.host.pipeline import new_orchestrator
    from omniduplex.pipeline.config import load_graph

    pcfg = load_graph(None, model=model)
    orch = new_orchestrator(pcfg, processes=processes)

    async def main():
        await orch.start()
        try:
            # warm-up: first-use allocations, lazy imports
            await ask(orch, questions[0], wavs[0], meta, live, prefill)
            if verbose:
                print(f"\nbench qa: {model}")
                print("| # | voice | wpm | heard | reply | right | TTFP ms |")
                print("|---|---|---|---|---|---|---|", flush=True)
            answers = []
            for i, (q, w) in enumerate(zip(questions, wavs), 1):
                answers.append(await ask(orch, q, w, meta, live, prefill))
                if verbose:
                    _print_row(i, q, answers[-1])
            return answers
        finally:
            await orch.stop()

    return asyncio.run(main())


def run(
    models: list[str],
    limit: int | None = None,
    max_tokens: int = 48,
    greedy: bool = True,
    json_out: Path | None = None,
    questions_file: Path = QUESTIONS,
    verbose: bool = True,
    processes: bool = True,
    live: bool = True,
    prefill: bool = True,
) -> dict[str, dict]:
    """Ask the first ``limit`` questions (all by default) of each cascade manifest in ``models`` (resolved
    paths), through stage processes (``processes``) or in this process, fed while spoken (``live``) or
    whole (``prefill``: the LLM prefilling while the user speaks, live only), print a table per manifest and
    a summary; returns ``{model: {"summary", "answers"}}``.

    Raises:
        ValueError: a model that is not a cascade manifest; ``RuntimeError``: espeak-ng or sox missing.
    """
    from omniduplex.app.host.pipeline import RespondOptions
    from omniduplex.models.cascade.manifest import is_cascade
    from omniduplex.models.weights import cache_dir
    from omniduplex.pipeline.audio_io import load_audio

    for m in models:
        if not is_cascade(m):
            raise ValueError(f"bench qa: {m} is not a cascade manifest (a cascade.yaml or its folder)")
    questions = load_questions(questions_file)[:limit]
    wavs = [load_audio(speak(q, cache_dir() / "bench-qa"), 16000) for q in questions]
    meta = RespondOptions(greedy=greedy, max_tokens=max_tokens).meta("cascade")
    results = {}
    for m in models:
        answers = run_manifest(m, questions, wavs, meta, processes, verbose, live, prefill and live)
        results[m] = {"summary": summarize(answers), "answers": [asdict(a) for a in answers]}
    _print_summary(results, max_tokens, greedy, processes, live, prefill and live)
    if json_out:
        json_out.write_text(json.dumps(results, indent=2))
    return results


def _print_row(i: int, q: Question, a: Answer) -> None:
    reply = (a.error and f"error: {a.error}") or " ".join(a.reply.split())
    ttfp = f"{a.metrics['ttfp_ms']:.0f}" if a.metrics else "-"
    print(
        f"| {i} | {q.voice} | {q.speed} | {a.transcript.strip()} | {reply[:90]} | "
        f"{'yes' if a.right else 'no'} | {ttfp} |",
        flush=True,
    )


def _print_summary(
    results: dict[str, dict],
    max_tokens: int,
    greedy: bool,
    processes: bool,
    live: bool = False,
    prefill: bool = False,
) -> None:
    how = ("greedy" if greedy else "sampled") + (", stage processes" if processes else ", in-process")
    how += ", ASR fed while spoken" if live else ", whole turns"
    how += ", LLM prefilled while spoken" if prefill else ""
    print(f"\nbench qa summary: c=1, {how}, ≤{max_tokens} reply tokens; ms are p50 / p90")
    head = "| manifest | right | accuracy | ASR WER | right when heard | TTFP | ASR | ASR wall |"
    print(head + " LLM first clause | TTS first chunk | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m, r in results.items():
        s = r["summary"]
        cells = [f"{s[f'{k}_p50']:.0f} / {s[f'{k}_p90']:.0f}" for k in ("ttfp_ms", *SPLIT)]
        print(
            f"| {m} | {s['right']}/{s['asked']} | {100 * s['accuracy']:.0f}% | {100 * s['asr_wer']:.0f}% | "
            f"{s['right_when_heard']}/{s['heard']} | "
            f"{' | '.join(cells)} | {s['errors']} |"
        )
