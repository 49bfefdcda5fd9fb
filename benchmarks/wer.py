"""Word error rate for the speech benchmarks and tests: word-level Levenshtein distance over lower-cased
words, punctuation dropped (the usual ASR WER, e.g. NIST sclite, without its text normalisation)."""

from __future__ import annotations

import re


def words_of(text: str) -> list[str]:
    """Lower-case words of ``text``, punctuation dropped (hyphens split words, apostrophes stay)."""
    return re.findall(r"[a-z0-9']+", text.lower())


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Word edits (substitutions + deletions + insertions) that turn ``ref`` into ``hyp``."""
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[len(hyp)]


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: :func:`edit_distance` of the two texts' words ÷ the reference's word count (1 word
    at least, so an empty reference does not divide by zero)."""
    ref = words_of(reference)
    return edit_distance(ref, words_of(hypothesis)) / max(1, len(ref))
