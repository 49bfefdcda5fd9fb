"""The spoken evaluation set of ``bench qa`` and ``bench asr``: the questions of :file:`qa_questions.yaml`
rendered as audio at run time, and the text normalisation both benchmarks score with.

Each question is spoken by espeak-ng (a voice variant, a speed in words per minute, a pitch) or by the
packaged Piper voice (en_US joe, :data:`~omniduplex.models.weights.PIPER_JOE`; length scale 160 / speed),
then passed through its channel:

- ``clean``: as synthesised, 16 kHz mono 16-bit;
- ``phone``: the narrowband telephone channel, a 300–3400 Hz band (ITU-T G.712) at 8 kHz, 8-bit μ-law
  (ITU-T G.711), decoded and resampled back to 16 kHz;
- ``noise``: pink noise (1/f power, drawn from a generator seeded by the clip's settings, so the same
  samples every run) added at :data:`NOISE_SNR_DB` dB signal-to-noise ratio over the whole clip.

Files are cached under ``<cache>/bench-qa`` by a hash of everything that makes them. Nothing is downloaded:
espeak-ng and sox come from Debian (``scripts/install.sh``), Piper from its PyPI voice package.

Scoring: :func:`words` is OpenAI Whisper's English text normaliser (the ``whisper-normalizer`` package,
the normalisation of Whisper's paper and of the Open ASR Leaderboard: lower case, punctuation and fillers
dropped, contractions expanded, "Mr." → "mister", British spellings American, ~1,700 of them), then
spelled numbers written as digits ("twenty-four" → ``24``, "one hundred and twenty" → ``120``; its own
number normaliser is left out: it writes "minus five" as "-5" and keeps a lone "one"), so an answer "24"
matches "twenty four", an ASR writing "7" for "seven", "colour" for "color" or "what's" for "what is" makes
no word error. :func:`key_words` are a question's content words (stop words dropped); the key words are
*heard* when every one of them is in the transcript.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from whisper_normalizer.english import EnglishTextNormalizer

SAMPLE_RATE = 16000
"""Rate of every rendered clip (Hz): what the ASR stage takes."""
NOISE_SNR_DB = 10.0
"""Signal-to-noise ratio of the ``noise`` channel (dB, power over the whole clip)."""
CHANNELS = ("clean", "phone", "noise")
PIPER = "piper"
"""The ``voice`` that selects the packaged Piper voice instead of espeak-ng."""

_UNIT_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
)
_TENS_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety"
_UNITS = {w: i for i, w in enumerate(_UNIT_WORDS.split())}
_TENS = {w: 10 * i for i, w in enumerate(_TENS_WORDS.split(), 2)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_STOP = (
    "a an the is are was were be do does did of in on at to for from by with and or what which who whom "
    "whose how when where why that this these those there their it its i im me my you your we our us they "
    "them can could would should will tell please quick question know give name some any s t m am"
)
STOP_WORDS = frozenset(_STOP.split())
"""Words a question's key words leave out (function words; the numbers are kept)."""


class _Normalizer(EnglishTextNormalizer):
    """Whisper's English normaliser less its number normaliser (:func:`_number_words` does numbers)."""

    def __init__(self) -> None:
        super().__init__()
        self.standardize_numbers = lambda s: s


_normalize = _Normalizer()


def _number_words(tokens: list[str]) -> list[str]:
    """``tokens`` with each run of spelled number words replaced by its value in digits; a run ends where a
    word could not continue the number ("one two" is two numbers, "twenty four" one)."""
    out: list[str] = []
    total = current = None  # the number being read: total (thousands and above) + current (below)
    last = ""  # kind of its last word: unit, tens, hundred, scale

    def flush():
        nonlocal total, current, last
        if total is not None or current is not None:
            out.append(str((total or 0) + (current or 0)))
        total = current = None
        last = ""

    for i, w in enumerate(tokens):
        if w in _UNITS:
            v = _UNITS[w]
            fits = last in ("hundred", "scale") or (last == "tens" and v < 10)
            if not fits:
                flush()
            current, last = (current or 0) + v, "unit"
        elif w in _TENS:
            if last not in ("hundred", "scale"):
                flush()
            current, last = (current or 0) + _TENS[w], "tens"
        elif w == "hundred":
            if last not in ("unit", "tens") or (current or 0) % 100 == 0 or (current or 0) >= 100:
                flush()
                current = 1
            current, last = current * 100, "hundred"
        elif w in _SCALES:
            if last == "":
                current = 1
            total, current, last = (total or 0) + (current or 1) * _SCALES[w], 0, "scale"
        elif (
            w == "and"
            and last in ("hundred", "scale")
            and i + 1 < len(tokens)
            and (tokens[i + 1] in _UNITS or tokens[i + 1] in _TENS)
        ):
            continue  # "one hundred and twenty"
        else:
            flush()
            out.append(w)
    flush()
    return out


def words(text: str) -> list[str]:
    """Lower-case words and numbers of ``text`` after Whisper's English normaliser (module docstring):
    punctuation and hyphens split words, thousands separators vanish ("1,000" → ``1000``), a decimal point
    stays ("3.5"), contractions expand ("what's" → ``what is``), British spellings become American
    ("colour" → ``color``), spelled numbers become digits ("twenty-four" → ``24``, "a hundred" →
    ``a 100``)."""
    found = re.findall(r"\d+(?:\.\d+)?|[a-z]+", _normalize(text))
    return _number_words(found)


def key_words(text: str) -> list[str]:
    """The content words of a question (:func:`words` less :data:`STOP_WORDS`), in order."""
    return [w for w in words(text) if w not in STOP_WORDS]


def key_heard(text: str, transcript: str) -> bool:
    """Whether every key word of ``text`` (:func:`key_words`) occurs in ``transcript`` (as a word)."""
    heard = set(words(transcript))
    return all(w in heard for w in key_words(text))


# -- rendering -------------------------------------------------------------------------------------------
_piper_voice = None


def _piper(text: str, speed: int, out: Path) -> None:
    """``text`` spoken by the packaged Piper voice into ``out`` (22.05 kHz WAV)."""
    global _piper_voice
    import wave

    from piper import PiperVoice, SynthesisConfig

    from omniduplex.models.weights import PIPER_JOE, PIPER_JOE_CONFIG, locate

    if _piper_voice is None:
        _piper_voice = PiperVoice.load(str(locate(PIPER_JOE)), config_path=str(locate(PIPER_JOE_CONFIG)))
    cfg = SynthesisConfig(length_scale=160 / speed, noise_scale=0.0, noise_w_scale=0.0)  # no sampling noise
    with wave.open(str(out), "wb") as f:
        _piper_voice.synthesize_wav(text, f, syn_config=cfg)


_BAND = ("sinc", "300-3400")
_PAD = ("pad", "0.3", "0.3")


def _sox(*args: str) -> None:
    subprocess.run(["sox", "-D", *args], check=True, capture_output=True)


def _pink_noise(n: int, seed: int) -> np.ndarray:
    """``n`` samples of unit-power pink (1/f power) noise: white noise shaped by 1/sqrt(f) in frequency."""
    rng = np.random.default_rng(seed)
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(spec.size, dtype=np.float64)
    f[0] = 1.0
    x = np.fft.irfft(spec / np.sqrt(f), n)
    return x / np.sqrt(np.mean(x**2))


def add_noise(wav: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    """``wav`` (float, any shape (samples,)) plus pink noise at ``snr_db`` dB below its mean power, clipped
    to [-1, 1]."""
    power = float(np.mean(wav.astype(np.float64) ** 2))
    noise = _pink_noise(wav.size, seed) * np.sqrt(power / 10 ** (snr_db / 10))
    return np.clip(wav + noise, -1.0, 1.0).astype(np.float32)


def render(text: str, voice: str, speed: int, pitch: int, channel: str, cache: Path) -> Path:
    """The clip of ``text`` spoken by ``voice`` (an espeak-ng voice or :data:`PIPER`) through ``channel``
    (:data:`CHANNELS`): a 16 kHz mono 16-bit WAV with 0.3 s of silence before and after, cached under
    ``cache`` by a hash of all settings (written through a temporary file, renamed into place).

    Raises:
        ValueError: an unknown channel. RuntimeError: espeak-ng or sox is missing, or synthesis failed.
    """
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r} (one of {', '.join(CHANNELS)})")
    for tool in ("sox",) if voice == PIPER else ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"the spoken set needs {tool} (scripts/install.sh installs it)")
    tag = f"{voice}|{speed}|{pitch}|{text}" + ("" if channel == "clean" else f"|{channel}")
    key = hashlib.sha256(tag.encode()).hexdigest()[:16]
    out = cache / f"{key}.wav"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        raw, wav = Path(tmp) / "raw.wav", Path(tmp) / "q.wav"
        try:
            if voice == PIPER:
                _piper(text, speed, raw)
            else:
                subprocess.run(
                    ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(raw), text],
                    check=True,
                    capture_output=True,
                )
            if channel == "phone":
                narrow = Path(tmp) / "phone.wav"
                _sox(str(raw), "-r", "8000", "-c", "1", "-e", "mu-law", "-b", "8", str(narrow), *_BAND)
                raw = narrow
            _sox(str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", "-e", "signed", str(wav), *_PAD)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"speaking {text!r} ({voice}, {channel}): {e.stderr.decode().strip()}") from e
        if channel == "noise":
            import soundfile as sf

            x, _ = sf.read(str(wav), dtype="float32")
            sf.write(str(wav), add_noise(x, NOISE_SNR_DB, int(key, 16) & 0xFFFFFFFF), SAMPLE_RATE, "PCM_16")
        wav.replace(out)  # atomic: a concurrent run never reads half a file
    return out
