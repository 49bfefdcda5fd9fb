"""The ASR decoders' beam search (models/cascade/beam_search.py) against an exhaustive search, on a decoder
whose next-token distribution depends on the whole prefix held in per-row state (as a KV cache is), so a
wrong parent gather changes the result; and Moonshine's beam on real speech."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from omniduplex.models.cascade.beam_search import Hypothesis, beam_search, log_softmax

EOS, VOCAB = 0, 4


class PrefixDecoder:
    """log p(next | prefix) from a hash of the whole prefix: row state = the prefix (the 'KV cache')."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rows: list[tuple[int, ...]] = [()]

    def log_probs(self, prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        return log_softmax(rng.standard_normal(VOCAB) * 2.0)

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        self.rows = [(*self.rows[p], int(t)) for t, p in zip(tokens, parents)]
        return np.stack([self.log_probs(r) for r in self.rows])


def exhaustive(dec: PrefixDecoder, max_tokens: int) -> Hypothesis:
    """Every sequence of fewer than ``max_tokens`` ids ended by EOS, best by rank (a search returns a
    sequence cut at the cap only when none ended)."""
    best = None
    for n in range(max_tokens):
        for ids in itertools.product(range(1, VOCAB), repeat=n):
            lp = sum(float(dec.log_probs(ids[:i])[t]) for i, t in enumerate(ids))
            h = Hypothesis(ids, lp + float(dec.log_probs(ids)[EOS]), True)
            if best is None or h.rank > best.rank:
                best = h
    return best


@pytest.mark.parametrize("seed", range(12))
def test_a_wide_beam_finds_the_exhaustive_best_and_beam_one_is_greedy(seed):
    max_tokens = 4
    dec = PrefixDecoder(seed)
    got = beam_search(dec.step, dec.log_probs(()), EOS, VOCAB**max_tokens, max_tokens)
    want = exhaustive(PrefixDecoder(seed), max_tokens)
    assert (got.ids, got.finished) == (want.ids, True) and got.logprob == pytest.approx(want.logprob)

    greedy, prefix = PrefixDecoder(seed), ()
    while len(prefix) < max_tokens and (t := int(np.argmax(greedy.log_probs(prefix)))) != EOS:
        prefix = (*prefix, t)
    dec = PrefixDecoder(seed)
    assert beam_search(dec.step, dec.log_probs(()), EOS, 1, max_tokens).ids == prefix


def test_a_beam_and_patience_find_better_sequences_than_greedy_and_bad_arguments_are_errors():
    wins = patient_wins = 0
    for seed in range(30):
        g, b, p = PrefixDecoder(seed), PrefixDecoder(seed), PrefixDecoder(seed)
        one = beam_search(g.step, g.log_probs(()), EOS, 1, 5)
        four = beam_search(b.step, b.log_probs(()), EOS, 4, 5)
        patient = beam_search(p.step, p.log_probs(()), EOS, 4, 5, patience=2.0)
        wins += four.rank > one.rank + 1e-9
        patient_wins += patient.rank > four.rank + 1e-9
        assert patient.rank >= four.rank - 1e-9  # waiting for more finished ones never ranks lower here
    assert wins > 0 and patient_wins > 0  # neither is greedy (or the classic stop) in disguise
    with pytest.raises(ValueError, match="beam and max_tokens"):
        beam_search(lambda t, p: np.zeros((1, VOCAB)), np.zeros(VOCAB), EOS, 0, 3)
    with pytest.raises(ValueError, match="patience"):
        beam_search(lambda t, p: np.zeros((1, VOCAB)), np.zeros(VOCAB), EOS, 2, 3, patience=0.5)
    with pytest.raises(ValueError, match=r"\[vocab\]"):
        beam_search(lambda t, p: np.zeros((1, VOCAB)), np.zeros((1, VOCAB)), EOS, 2, 3)


def test_moonshine_beam_gathers_its_kv_cache_rows():
    """Beam 4 (the default) and greedy on real speech: the same words on a clear clip, and a beam of 1
    refused below 1. A wrong KV row gather decodes garbage after the first step."""
    from speech import words_of

    from omniduplex.models.cascade.asr import SAMPLE_RATE
    from omniduplex.models.cascade.moonshine import BEAM, MoonshineASR
    from omniduplex.models.weights import locate_moonshine_base
    from omniduplex.pipeline.audio_io import load_audio

    model_dir = locate_moonshine_base()
    wave = load_audio(model_dir.parents[1] / "test-data" / "beckett.wav", SAMPLE_RATE)[: 6 * SAMPLE_RATE]
    beam, greedy = MoonshineASR(model_dir), MoonshineASR(model_dir, beam=1)
    assert beam.beam == BEAM > 1
    assert words_of(beam.transcribe(wave).text) == words_of(greedy.transcribe(wave).text)
    assert words_of(beam.transcribe(wave).text)[:4] == ["ever", "tried", "ever", "failed"]
    with pytest.raises(ValueError, match="beam must be"):
        MoonshineASR(model_dir, beam=0)
