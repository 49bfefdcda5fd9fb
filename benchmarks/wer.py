"""Word error rate for the speech benchmarks and tests: word-level Levenshtein distance over lower-cased
words, punctuation dropped, whole numbers below 100 spelled out (the usual ASR WER, e.g. NIST sclite, with
only that much of its text normalisation: a TTS voice says "1." as "one"; an ASR model may write either)."""

from __future__ import annotations

import re

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _spelled(token: str) -> list[str]:
    """``token`` as spoken words when it is a whole number below 100 ("24" → ``["twenty", "four"]``, the
    split that :func:`words_of` gives "twenty-four"); any other token unchanged."""
    if not token.isdigit() or len(token) > 2:
        return [token]
    n = int(token)
    if n < 20:
        return [_ONES[n]]
    return [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])


def words_of(text: str) -> list[str]:
    """Lower-case words of ``text``, punctuation dropped (hyphens split words, apostrophes stay), whole
    numbers below 100 spelled out ("2." → ``["two"]``)."""
    return [w for tok in re.findall(r"[a-z0-9']+", text.lower()) for w in _spelled(tok)]


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
