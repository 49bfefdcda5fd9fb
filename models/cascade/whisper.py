"""Whisper speech recognition on CTranslate2 (faster-whisper), batched across concurrent utterances.

Whisper (Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision") reads a
30 s log-mel window (16 kHz, 10 ms hop, 80 or 128 bins) and decodes text tokens. faster-whisper's
``WhisperModel.transcribe`` handles one audio at a time; a voice assistant hears several users at once,
so :meth:`WhisperASR.transcribe_batch` runs every utterance of up to 30 s through one CTranslate2
``encode`` + ``generate`` (greedy, no previous-text prompt, ``<|notimestamps|>``) and one ``align`` for
the word timings. We use faster-whisper's public parts (``FeatureExtractor``, ``Tokenizer``, the
``ctranslate2.models.Whisper`` it loads) and do the batching, silence rejection and word timing here.

Word timings follow openai/whisper's ``timing.py`` (also what faster-whisper does for
``word_timestamps=True``): the cross-attention of the model's alignment heads,
median-filtered, is aligned to the text tokens by dynamic time warping (``Whisper.align``); a token starts
at the first encoder frame (20 ms) its path reaches, a word runs from its first token's start to the next
word's start.
"""

from __future__ import annotations

from pathlib import Path

import ctranslate2
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer

from omniduplex.models.cascade.transcript import SAMPLE_RATE, Transcript, Word

WINDOW_S = 30.0
"""Whisper's encoder window (s): longer utterances go through faster-whisper's sliding ``transcribe``."""
MAX_TOKENS = 448
"""Whisper's decoder context (tokens, prompt included)."""
_OPENING = "\"'“¿([{-"
_CLOSING = "\"'.。,，!！?？:：”)]}、"


class WhisperASR:
    """A CTranslate2 Whisper model directory (``model.bin``, ``config.json``, ``tokenizer.json``).

    Args:
        model_dir: the faster-whisper / CTranslate2 model directory.
        cpu_threads: CTranslate2 intra-op threads (one per stage process holds up under contention).
        compute_type: CTranslate2 quantisation (``int8`` on CPU; see CTranslate2's quantization docs).
        no_speech_threshold: an utterance whose ``<|nospeech|>`` probability exceeds this is silence or
            noise and gives ``Transcript(text="")`` (Whisper's hallucination guard; 0.6 is openai/whisper's
            default). Empty decoded text also gives ``text=""``.
        language: the spoken language (a Whisper code, ``"en"``) a multilingual model is told, as
            openai/whisper's ``language=`` option; ``None``: detected per utterance from the encoder output.
            English-only models (``*.en``) always decode English.

    Raises:
        RuntimeError / ValueError: from CTranslate2 when ``model_dir`` is not a Whisper model directory.
    """

    def __init__(
        self,
        model_dir: str | Path,
        cpu_threads: int = 1,
        compute_type: str = "int8",
        no_speech_threshold: float = 0.6,
        language: str | None = None,
    ) -> None:
        self._fw = WhisperModel(
            str(model_dir), device="cpu", compute_type=compute_type, cpu_threads=cpu_threads, num_workers=1
        )
        self.model: ctranslate2.models.Whisper = self._fw.model
        self.features = self._fw.feature_extractor
        self.multilingual = bool(self.model.is_multilingual)
        self.no_speech_threshold = no_speech_threshold
        self.language = language
        self._tokenizers: dict[str, Tokenizer] = {}
        self.window_frames = self.features.nb_max_frames  # 3000 mel frames = 30 s
        self.frames_per_token = 2  # the encoder's stride-2 conv: one encoder position per 20 ms

    def tokenizer(self, language: str = "en") -> Tokenizer:
        """faster-whisper's tokenizer for ``language`` (task ``transcribe``), cached."""
        tok = self._tokenizers.get(language)
        if tok is None:
            tok = self._tokenizers[language] = Tokenizer(
                self._fw.hf_tokenizer, self.multilingual, task="transcribe", language=language
            )
        return tok

    def transcribe(self, waveform: np.ndarray) -> Transcript:
        """One utterance: :meth:`transcribe_batch` of one."""
        return self.transcribe_batch([waveform])[0]

    def transcribe_batch(self, waveforms: list[np.ndarray]) -> list[Transcript]:
        """Transcribe utterances together: the ones of up to 30 s in one CTranslate2 batch.

        Args:
            waveforms: float32 mono ``[samples]`` at 16 kHz each, in [-1, 1].

        Returns:
            One :class:`Transcript` per waveform, in order. Each equals what the utterance gives alone
            (every item is padded to the same 30 s window, so batching changes no input).

        Raises:
            ValueError: a waveform that is not 1-D or has no samples.
        """
        out: list[Transcript | None] = [None] * len(waveforms)
        short: list[int] = []
        for i, w in enumerate(waveforms):
            if w.ndim != 1 or w.size == 0:
                raise ValueError(f"waveform {i}: need a non-empty 1-D 16 kHz array, got shape {w.shape}")
            if w.size > WINDOW_S * SAMPLE_RATE:
                out[i] = self._transcribe_long(np.asarray(w, dtype=np.float32))
            else:
                short.append(i)
        if short:
            for i, t in zip(short, self._batch([np.asarray(waveforms[i], np.float32) for i in short])):
                out[i] = t
        return out  # type: ignore[return-value]

    def _batch(self, waves: list[np.ndarray]) -> list[Transcript]:
        mels, frames = [], []
        for w in waves:
            mel = self.features(w)  # [n_mels, frames + 1]: one frame of the 160-sample tail padding
            frames.append(min(mel.shape[-1] - 1, self.window_frames))
            mels.append(_fit(mel, self.window_frames))
        encoded = self.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(mels))))
        languages = self._languages(encoded, len(waves))
        toks = [self.tokenizer(lang) for lang in languages]
        results = self.model.generate(
            encoded,
            [t.sot_sequence + [t.no_timestamps] for t in toks],
            beam_size=1,
            max_length=MAX_TOKENS,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=[-1],  # the model config's non-speech symbols
        )
        transcripts, keep = [], []
        for i, (r, tok, w) in enumerate(zip(results, toks, waves)):
            ids = [t for t in r.sequences_ids[0] if t < tok.eot]
            text = tok.decode(ids).strip()
            speech = bool(text) and r.no_speech_prob <= self.no_speech_threshold
            transcripts.append(Transcript(text if speech else "", [], languages[i], w.size / SAMPLE_RATE))
            if speech:
                keep.append((i, ids))
        if keep:
            self._add_words(encoded, len(waves), keep, toks, frames, transcripts)
        return transcripts

    def _languages(self, encoded: ctranslate2.StorageView, n: int) -> list[str]:
        if not self.multilingual:
            return ["en"] * n
        if self.language is not None:
            return [self.language] * n
        return [scores[0][0][2:-2] for scores in self.model.detect_language(encoded)]  # "<|fr|>" → "fr"

    def _add_words(self, encoded, batch, keep, toks, frames, transcripts) -> None:
        """Word timings for the utterances in ``keep`` (``(index, text token ids)``), one ``align`` call
        per start sequence (one for English-only models)."""
        by_start: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        for i, ids in keep:
            by_start.setdefault(tuple(toks[i].sot_sequence), []).append((i, ids))
        for start, group in by_start.items():
            rows = [i for i, _ in group]
            enc = encoded
            if len(rows) != batch:  # only some items have speech: align their encoder rows
                enc = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.asarray(encoded)[rows]))
            aligned = self.model.align(
                enc, list(start), [ids for _, ids in group], [frames[i] for i in rows], median_filter_width=7
            )
            for (i, ids), a in zip(group, aligned):
                transcripts[i].words = _words(toks[i], ids, a, transcripts[i].duration_s)

    def _transcribe_long(self, wave: np.ndarray) -> Transcript:
        """Over 30 s: faster-whisper's sliding-window ``transcribe`` with the same greedy settings."""
        segments, info = self._fw.transcribe(
            wave,
            beam_size=1,
            best_of=1,
            temperature=0.0,
            condition_on_previous_text=False,
            no_speech_threshold=self.no_speech_threshold,
            word_timestamps=True,
            language=self.language if self.multilingual else "en",
        )
        words, texts = [], []
        for s in segments:
            texts.append(s.text.strip())
            words.extend(
                Word(w.word, float(w.start), float(w.end), float(w.probability)) for w in s.words or []
            )
        return Transcript(" ".join(t for t in texts if t), words, info.language, wave.size / SAMPLE_RATE)


def _fit(mel: np.ndarray, n: int) -> np.ndarray:
    """``mel`` ``[n_mels, t]`` cut or zero-padded to ``t = n`` frames (the encoder's fixed window)."""
    if mel.shape[-1] >= n:
        return mel[:, :n]
    return np.pad(mel, ((0, 0), (0, n - mel.shape[-1])))


def _words(tok: Tokenizer, ids: list[int], aligned, duration_s: float) -> list[Word]:
    """Words and their timings from one ``Whisper.align`` result.

    ``aligned.alignments`` is the DTW path as ``(token index, encoder position)`` pairs over ``ids`` plus
    the end-of-text token; a token starts at the first position its path reaches (20 ms per position).
    """
    pieces, piece_ids = tok.split_to_word_tokens(ids + [tok.eot])
    n_tokens = len(ids) + 1
    token_start = np.full(n_tokens, -1, dtype=np.int64)
    for t_idx, pos in aligned.alignments:
        if 0 <= t_idx < n_tokens and token_start[t_idx] < 0:
            token_start[t_idx] = pos
    token_start = np.maximum.accumulate(np.where(token_start < 0, 0, token_start))  # monotonic
    probs = np.asarray(aligned.text_token_probs, dtype=np.float64)
    sec_per_pos = 2 * 160 / SAMPLE_RATE  # two mel hops of 10 ms
    words: list[dict] = []
    at = 0
    for piece, p_ids in zip(pieces, piece_ids):
        first, at = at, at + len(p_ids)
        if at > len(ids):  # the end-of-text piece
            break
        p = float(probs[first:at].mean()) if at > first else 0.0
        words.append({"word": piece, "first": first, "next": at, "p": p})
    words = _merge_punctuation(words)
    out = []
    for w in words:
        start = min(duration_s, float(token_start[w["first"]]) * sec_per_pos)
        end = min(duration_s, float(token_start[w["next"]]) * sec_per_pos)
        out.append(Word(w["word"], round(start, 3), round(max(end, start), 3), w["p"]))
    return out


def _merge_punctuation(words: list[dict]) -> list[dict]:
    """Attach a word that is only opening punctuation (`` "``, `` (``) to the next word, and one that is
    only closing punctuation without a leading space (``.``, ``?``, ``"``) to the previous word; the
    merged word keeps the timing of its spoken part."""
    out: list[dict] = []
    carry: dict | None = None
    for w in words:
        text = w["word"]
        if carry is not None:
            w = {**w, "word": carry["word"] + text.lstrip(), "p": w["p"]}
            carry = None
        if text.startswith(" ") and text.strip() and all(c in _OPENING for c in text.strip()):
            carry = w
            continue
        if out and not text.startswith(" ") and text and all(c in _CLOSING for c in text):
            out[-1] = {**out[-1], "word": out[-1]["word"] + text}
            continue
        out.append(w)
    if carry is not None:
        out.append(carry)
    return out
