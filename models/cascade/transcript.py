"""What an ASR model hears: the transcript of one utterance with its word timings, shared by every ASR model
of the cascade (:mod:`.whisper`, :mod:`.moonshine`) and the stage that runs them."""

from __future__ import annotations

from dataclasses import dataclass, field

SAMPLE_RATE = 16_000
"""Input rate of every ASR model here (Hz): Whisper's log-mel front end, Moonshine's raw-audio encoder."""


@dataclass(frozen=True)
class Word:
    """One recognised word: ``word`` as Whisper spells it (leading space included, punctuation attached),
    ``start_s``/``end_s`` seconds from the start of the utterance, ``probability`` the mean of its tokens'
    probabilities (0..1)."""

    word: str
    start_s: float
    end_s: float
    probability: float


@dataclass
class Transcript:
    """What one utterance said.

    ``text``: the transcript, stripped ("" for silence, noise or nothing recognisable); ``words``: its
    words in order with monotonic timings inside ``[0, duration_s]``; ``language``: ISO code ("en" for
    English-only models); ``duration_s``: the utterance length (s).
    """

    text: str
    words: list[Word] = field(default_factory=list)
    language: str = "en"
    duration_s: float = 0.0
