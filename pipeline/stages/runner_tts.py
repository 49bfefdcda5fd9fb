"""The cascade's TTS stage on a registered TTS family's checkpoint (manifest ``tts:`` a VoxCPM2, Higgs Audio
v3, Fish Speech S2 Pro or plugin family folder): the LLM's streamed reply text → speech in the manifest's
voice, every turn's clauses on the family's continuous-batching engine
(:class:`~omniduplex.pipeline.speech.family_runner.FamilyRunner`) with its serving lever on.

Contract and turn plumbing: :class:`~.engine_tts.EngineTTSStageWorker`. Each clause's audio streams out of
its decoder at the family's rate (48 / 24 / 44.1 kHz) as frames come, resampled to the graph's rate through
a per-clause ``soxr.ResampleStream`` (one continuous signal per clause; none when the rates agree).

Voice: the manifest's (``tts_voice``, or a clone of ``tts_ref_audio`` + ``tts_ref_text``, checked when the
stage loads); ``voice`` on a turn's first message naming one of the family's voices speaks that turn in it,
any other name keeps the manifest's voice, so a client's default voice (``alloy``) never fails a turn.
"""

from __future__ import annotations

import numpy as np
import torch

from omniduplex.pipeline.speech.family_runner import FamilyRunner
from omniduplex.pipeline.stages.engine_tts import EngineTTSStageWorker


class RunnerTTSStageWorker(EngineTTSStageWorker):
    """Streaming synthesis of every reply in flight on one TTS family's runner.

    Args:
        runner: the loaded checkpoint and its engine.
        voice: the stage's voice: a voice name, or ``(clip float32 [n], rate, transcript or None)`` to clone
            (``None``: the family's default).
        output_rate: rate the graph declares for the stage's ``pcm`` (Hz).
        first_max_words, min_words: clause sizes (:class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`).
        max_frames: frames per clause at most (the family's frames; the context caps it too);
            ``sampling``: the family engine's keys over its defaults.

    Raises TTSInputError: the family cannot speak in ``voice`` (an unknown name, a clip it refuses).
    """

    def __init__(
        self,
        runner: FamilyRunner,
        voice: str | tuple | None = None,
        output_rate: int = 24_000,
        first_max_words: int = 4,
        min_words: int = 3,
        max_frames: int = 1024,
        sampling: dict | None = None,
    ) -> None:
        self.runner, self.tts = runner, runner.engine
        self.engine = getattr(runner.engine, "engine", None)  # our Engine: the KV gauges of stage_stats
        self.output_rate, self.first_max_words, self.min_words = output_rate, first_max_words, min_words
        self.max_frames, self.sampling = max_frames, dict(sampling or {})
        self.voice = self._check(voice)
        self.names = {v.name for v in runner.voices()}
        self._init_turns()

    def stats(self) -> dict[str, int]:
        """The engine's gauges when the family runs on our engine, else ``batch_size``: clauses in flight."""
        if self.engine is not None:
            return super().stats()
        return {"batch_size": sum(t.active is not None for t in self.turns.values())}

    def _check(self, voice: str | tuple | None) -> str | None:
        """The stage's voice name: a clip is registered once as the voice ``manifest`` (every clause reuses
        its encoding); a name is checked against the family's voices."""
        if isinstance(voice, tuple):
            return self.runner.register("manifest", voice[:2], voice[2])
        self.runner.prompt("Hello.", voice)  # an unknown voice fails the stage's start with the reason
        return voice

    def voice_for(self, name: str | None) -> str | None:
        """The manifest's voice, or the family's voice ``name`` when it has one by that name."""
        return name if isinstance(name, str) and name in self.names else self.voice

    def _admit(self, request_id: str, text: str, voice: str | None):
        prompt = self.runner.prompt(text, voice)  # TTSInputError is a ValueError
        self.runner.add(request_id, prompt, self.max_frames, self.sampling)
        return self.runner.rate_decoder(prompt, self.output_rate)

    def _pieces(self, state, ev) -> list[torch.Tensor]:
        pcm = self.runner.rate_pcm(state, ev)
        return [torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32))] if pcm.size else []
