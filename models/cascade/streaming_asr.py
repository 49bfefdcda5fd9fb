"""Incremental transcription of the open turn: cut its audio into chunks as it arrives, transcribe each
closed chunk once while the user is still speaking, so that at end of turn only the tail chunk is left.

Two pieces, one job each:

* :class:`ChunkCutter` — a pure policy over the audio samples: where the open turn may be cut. A chunk
  closes in the middle of an in-turn pause (a run of quiet 20 ms frames, quiet = RMS this far below the
  loudest frame heard so far), or, with no pause by ``max_chunk_s``, at the quietest frame of its last
  ``search_s`` (between words, most of the time). It counts audio samples, never wall time.
* :class:`IncrementalTranscriber` — the chunks of one turn and their texts. It does not call the model
  itself: :meth:`~IncrementalTranscriber.jobs` says which waveforms need decoding (each closed chunk once,
  and the open chunk's hypothesis every ``hypothesis_every_s`` of new audio, or when a pause begins), and
  :meth:`~IncrementalTranscriber.take` stores the texts, so a stage can batch the jobs of many turns in
  one ``transcribe_batch`` call; :meth:`~IncrementalTranscriber.step` does both for one turn.

At end of turn the open chunk is decoded as the tail, unless it is all quiet (the end of turn was found
in a pause that had already closed the chunk before it), or its latest hypothesis already covers all of
its sound (only quiet frames came after it: the user's silence while the end of turn was being detected);
that hypothesis is then the chunk's text, and nothing is left to decode.

An encoder-decoder ASR (Moonshine, Whisper) sees each chunk alone, so a word split by a forced cut may be
misheard; cutting at pauses keeps the concatenated transcript word for word the one-shot one on speech
with pauses (``tests/test_streaming_asr.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SAMPLE_RATE = 16_000
"""Input rate (Hz): the cascade's ASR models read 16 kHz mono."""

PAUSE_HYPOTHESIS_MS = 100
"""Quiet audio at the end of the open chunk after which its hypothesis is decoded at once, whatever the
``hypothesis_every_s`` period (a pause may be the end of turn; the session feeds it at once too)."""


@dataclass(frozen=True)
class ChunkPolicy:
    """Where a turn may be cut (all durations in seconds or milliseconds of audio).

    Attributes:
        frame_ms: analysis frame (20 ms: the session's VAD frame).
        pause_ms: a run of quiet frames this long closes the chunk, cut at the run's middle.
        min_chunk_s: no chunk shorter than this (a very short chunk loses context for the model).
        max_chunk_s: with no pause by this length, the chunk is cut at its quietest frame.
        search_s: how far back from ``max_chunk_s`` the quietest frame is searched.
        quiet_db: a frame whose RMS is this many dB below the loudest frame so far is quiet.
        floor_rms: a frame below this RMS (-70 dBFS) is quiet whatever the level.
    """

    frame_ms: int = 20
    pause_ms: int = 200
    min_chunk_s: float = 2.0
    max_chunk_s: float = 5.0
    search_s: float = 2.0
    quiet_db: float = 30.0
    floor_rms: float = 3e-4

    def __post_init__(self) -> None:
        if not 0 < self.min_chunk_s < self.max_chunk_s or not 0 < self.search_s <= self.max_chunk_s:
            raise ValueError(f"chunk policy needs 0 < min_chunk_s < max_chunk_s, 0 < search_s: {self}")
        if self.frame_ms <= 0 or self.pause_ms < self.frame_ms:
            raise ValueError(f"chunk policy needs 0 < frame_ms <= pause_ms: {self}")


class ChunkCutter:
    """Pure cut policy (:class:`ChunkPolicy`) fed the turn's samples in pieces of any size.

    :meth:`push` returns the cut positions (sample index from the start of the turn) its samples closed;
    the same audio gives the same cuts however it is split into pieces.
    """

    def __init__(self, policy: ChunkPolicy | None = None, rate: int = SAMPLE_RATE) -> None:
        self.policy = policy or ChunkPolicy()
        p = self.policy
        self.frame = rate * p.frame_ms // 1000
        self.pause_frames = p.pause_ms // p.frame_ms
        self.min_frames = round(p.min_chunk_s * rate / self.frame)
        self.max_frames = round(p.max_chunk_s * rate / self.frame)
        self.search_frames = round(p.search_s * rate / self.frame)
        self.ratio = 10 ** (-p.quiet_db / 20)
        self._carry = np.zeros(0, np.float32)
        self.rms: list[float] = []  # per frame of the turn so far
        self.peak = 0.0
        self.chunk_start = 0  # frame index where the open chunk starts
        self._quiet_run = 0
        self._spoke = False  # a loud frame since the last cut

    def push(self, samples: np.ndarray) -> list[int]:
        """Feed float32 ``[samples]``; returns the new cut positions (samples, increasing)."""
        buf = np.concatenate([self._carry, np.asarray(samples, np.float32).reshape(-1)])
        n = buf.size // self.frame
        self._carry = buf[n * self.frame :]
        cuts = []
        for f in range(n):
            frame = buf[f * self.frame : (f + 1) * self.frame]
            cut = self._frame(float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))))
            if cut is not None:
                cuts.append(cut * self.frame)
        return cuts

    def _frame(self, rms: float) -> int | None:
        """One frame's RMS in; the cut (frame index, the cut is at that frame's start) it makes, if any."""
        self.rms.append(rms)
        self.peak = max(self.peak, rms)
        idx = len(self.rms) - 1
        quiet = rms < max(self.policy.floor_rms, self.peak * self.ratio)
        self._quiet_run = self._quiet_run + 1 if quiet else 0
        self._spoke = self._spoke or not quiet
        length = idx + 1 - self.chunk_start
        if self._spoke and self._quiet_run == self.pause_frames:
            cut = idx + 1 - self.pause_frames // 2  # the middle of the pause heard so far
            if cut - self.chunk_start >= self.min_frames:
                return self._cut(cut)
        if length >= self.max_frames:
            lo = max(self.chunk_start + self.min_frames, idx + 1 - self.search_frames)
            window = self.rms[lo : idx + 1]
            return self._cut(lo + int(np.argmin(window)))
        return None

    def quiet_since(self, sample: int) -> bool:
        """Whether every frame from the one holding ``sample`` (index from the start of the turn) to the
        last sample pushed is quiet, by the loudest frame heard so far."""
        level = max(self.policy.floor_rms, self.peak * self.ratio)
        tail = self._carry.astype(np.float64)
        if tail.size and np.sqrt(np.mean(tail**2)) >= level:
            return False
        return all(r < level for r in self.rms[sample // self.frame :])

    def _cut(self, frame: int) -> int:
        self.chunk_start = frame
        self._spoke = any(r >= max(self.policy.floor_rms, self.peak * self.ratio) for r in self.rms[frame:])
        return frame


@dataclass
class Partial:
    """The transcript of the open turn so far.

    ``stable``: the closed chunks' text (will not change); ``hypothesis``: the open chunk's latest
    decode ("" if none yet; replaced by later ones); ``text``: both joined.
    """

    stable: str
    hypothesis: str = ""

    @property
    def text(self) -> str:
        return " ".join(t for t in (self.stable, self.hypothesis) if t)


@dataclass
class _Job:
    kind: str  # "chunk" or "hypothesis"
    start: int
    end: int


@dataclass
class IncrementalTranscriber:
    """One turn's audio, chunked as it arrives, each closed chunk transcribed once.

    Args:
        policy: where to cut (:class:`ChunkPolicy`).
        hypothesis_every_s: decode the open chunk again after this much new audio (``None``: never;
            partials then carry only the closed chunks).
        min_hypothesis_s: no hypothesis for an open chunk shorter than this.

    Attributes:
        decoded_samples: audio decoded so far, hypotheses included (samples).
        final_samples: audio the jobs after :meth:`finish` cover (samples): the tail left at end of turn.
    """

    policy: ChunkPolicy = field(default_factory=ChunkPolicy)
    hypothesis_every_s: float | None = 0.4
    min_hypothesis_s: float = 0.5
    decoded_samples: int = 0
    final_samples: int = 0

    def __post_init__(self) -> None:
        self.cutter = ChunkCutter(self.policy)
        self._audio: list[np.ndarray] = []
        self.samples = 0
        self.bounds: list[int] = [0]  # chunk boundaries (samples); the open chunk starts at bounds[-1]
        self.texts: list[str | None] = []  # one per closed chunk, None until decoded
        self.hypothesis = ""
        self._hyp_at = 0  # samples when the last hypothesis was asked for
        self._hyp_end: int | None = None  # end of the audio the open chunk's stored hypothesis covers
        self._jobs: list[_Job] = []
        self.finished = False

    def push(self, samples: np.ndarray) -> None:
        """Append float32 16 kHz ``[samples]`` of the open turn.

        Raises:
            RuntimeError: after :meth:`finish`.
        """
        if self.finished:
            raise RuntimeError("turn already finished")
        samples = np.asarray(samples, np.float32).reshape(-1)
        self._audio.append(samples)
        self.samples += samples.size
        for cut in self.cutter.push(samples):
            self._close(cut)

    def finish(self) -> None:
        """End of turn: the open chunk (the tail) closes; its decode is the only work left, unless it is all
        quiet (its text is then "") or its latest hypothesis covers all its sound (only quiet frames after
        it: that is then its text)."""
        if not self.finished:
            self.finished = True
            if self.samples > self.bounds[-1]:
                silent = self.cutter.quiet_since(self.bounds[-1])
                covered = self._hyp_end is not None and self.cutter.quiet_since(self._hyp_end)
                hypothesis = "" if silent else self.hypothesis
                self._close(self.samples)
                if silent or covered:
                    self.texts[-1] = hypothesis
            self.final_samples = sum(
                self.bounds[i + 1] - self.bounds[i] for i, t in enumerate(self.texts) if t is None
            )

    def _close(self, end: int) -> None:
        if end > self.bounds[-1]:
            self.bounds.append(end)
            self.texts.append(None)
            self.hypothesis, self._hyp_at, self._hyp_end = "", end, None

    def audio(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The turn's samples ``[start, end)``."""
        if len(self._audio) > 1:
            self._audio = [np.concatenate(self._audio)]
        whole = self._audio[0] if self._audio else np.zeros(0, np.float32)
        return whole[start:end]

    def jobs(self, periodic: bool = True, pause: bool = True) -> list[np.ndarray]:
        """Waveforms to decode now, in order: each closed, undecoded chunk, then (before :meth:`finish`)
        the open chunk when a hypothesis is due (with ``pause``, a pause began; with ``periodic``,
        ``hypothesis_every_s`` of new audio came). Pass their texts to :meth:`take` in the same order."""
        self._jobs = [
            _Job("chunk", self.bounds[i], self.bounds[i + 1]) for i, t in enumerate(self.texts) if t is None
        ]
        open_len = self.samples - self.bounds[-1]
        if (
            not self.finished
            and self.hypothesis_every_s is not None
            and open_len >= self.min_hypothesis_s * SAMPLE_RATE
            and (
                periodic and self.samples - self._hyp_at >= self.hypothesis_every_s * SAMPLE_RATE
                or pause and self._pause_begun()
            )
        ):
            self._jobs.append(_Job("hypothesis", self.bounds[-1], self.samples))
            self._hyp_at = self.samples
        waves = [self.audio(j.start, j.end) for j in self._jobs]
        self.decoded_samples += sum(w.size for w in waves)
        return waves

    def _pause_begun(self) -> bool:
        """The newest audio is a pause (its last ``PAUSE_HYPOTHESIS_MS`` quiet) with sound since the last
        hypothesis was asked for: decode now, so that if the pause is the end of turn, the hypothesis
        covers all the sound and nothing is left to decode then."""
        pause = SAMPLE_RATE * PAUSE_HYPOTHESIS_MS // 1000
        return (
            self.samples - self._hyp_at > pause
            and self.cutter.quiet_since(self.samples - pause)
            and not self.cutter.quiet_since(self._hyp_at)
        )

    def take(self, texts: list[str]) -> Partial:
        """Store the texts of the last :meth:`jobs` (same order); returns the partial transcript.

        Raises:
            ValueError: not one text per job.
        """
        if len(texts) != len(self._jobs):
            raise ValueError(f"{len(self._jobs)} jobs, {len(texts)} texts")
        for job, text in zip(self._jobs, texts):
            if job.kind == "hypothesis":
                if job.start == self.bounds[-1]:  # still the open chunk
                    self.hypothesis, self._hyp_end = text.strip(), job.end
            else:
                self.texts[self.bounds.index(job.start)] = text.strip()
        self._jobs = []
        return self.partial()

    def step(self, asr) -> Partial:
        """Decode :meth:`jobs` with ``asr.transcribe_batch`` and :meth:`take` the texts."""
        waves = self.jobs()
        return self.take([t.text for t in asr.transcribe_batch(waves)] if waves else [])

    def partial(self) -> Partial:
        """Closed chunks' text (decoded ones, in order, up to the first not yet decoded) and hypothesis."""
        done = []
        for t in self.texts:
            if t is None:
                break
            done.append(t)
        return Partial(" ".join(t for t in done if t), "" if self.finished else self.hypothesis)

    @property
    def done(self) -> bool:
        """Finished and every chunk decoded."""
        return self.finished and all(t is not None for t in self.texts)

    @property
    def text(self) -> str:
        """The whole transcript (valid once :attr:`done`)."""
        return " ".join(t for t in self.texts if t)


def split_points(wave: np.ndarray, policy: ChunkPolicy | None = None) -> list[int]:
    """Chunk boundaries of a whole utterance by :class:`ChunkCutter` (``[0, cut, ..., wave.size]``)."""
    cuts = ChunkCutter(policy).push(wave)
    return [0, *[c for c in cuts if 0 < c < wave.size], wave.size]
