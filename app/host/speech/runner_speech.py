"""A TTS family's checkpoint behind ``POST /v1/audio/speech`` (every registered family without a speech
service of its own: VoxCPM2, Higgs Audio v3, Fish Speech S2 Pro, plugins'): the family's
:class:`~omniduplex.pipeline.speech.family_runner.FamilyRunner` (checks, prompts, engine, streaming decoder)
on the shared engine thread (:class:`~.engine_speech.EngineSpeech`), each request's audio resampled as one
stream from the family's rate (48, 24 or 44.1 kHz) to the API's 24 kHz.

Request fields: ``voice`` one of the family's voices (``GET /v1/audio/voices``; none: the default);
``ref_audio`` a base64 WAV (or ``data:audio/wav;base64,`` URL) to clone, at the family's reference rate,
with ``ref_text`` its transcript (Fish Speech needs it; VoxCPM2 uses it as a continuation prompt); Higgs
refuses a raw clip with the reason. ``instructions`` and ``language`` go to the runner (those families
ignore them).
Every refusal is a :class:`~.contract.SpeechError` naming the field, raised before anything is queued.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
import soundfile as sf

from omniduplex.app.host.speech.contract import SPEECH_RATE, SpeechError, SpeechParams
from omniduplex.app.host.speech.engine_speech import EngineSpeech
from omniduplex.pipeline.speech.family_runner import FamilyRunner, TTSInputError


def decode_clip(data: str, param: str = "ref_audio") -> tuple[np.ndarray, int]:
    """A base64 audio file (or ``data:…;base64,`` URL) → (float32 mono ``[n]``, its rate in Hz); the rate
    and length are the family's to check.

    Raises SpeechError: not base64, or not audio libsndfile reads."""
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        raw = base64.b64decode(data, validate=True)
        wav, rate = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    except (binascii.Error, ValueError) as e:
        raise SpeechError(f"{param} is not base64: {e}", param) from e
    except (RuntimeError, sf.LibsndfileError) as e:
        raise SpeechError(f"{param} is not an audio file: {e}", param) from e
    return wav.mean(axis=1), int(rate)


class RunnerSpeech(EngineSpeech):
    """A loaded engine-family checkpoint serving speech requests (module docstring).

    Args:
        runner: the loaded checkpoint (:func:`~omniduplex.pipeline.speech.registry.load_runner`).
        max_frames: frames per request at most (the family's frame: a VoxCPM2 patch is 160 ms, a Higgs or
            Fish frame 40 / 46 ms); the context caps it too.
        sampling: the family engine's sampling keys over its defaults (``{"temperature": 0}`` greedy for
            Higgs and Fish; ``{"seed": 0}`` for VoxCPM2's flow noise).
    """

    sample_rate = SPEECH_RATE

    def __init__(self, runner: FamilyRunner, max_frames: int = 1024, sampling: dict | None = None) -> None:
        self.runner, self.engine = runner, runner.engine
        self.max_frames, self.sampling = max_frames, dict(sampling or {})
        self._start(f"{runner.family}-speech")

    @classmethod
    def load(
        cls, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True, **kw
    ) -> RunnerSpeech:
        """The checkpoint in ``model_dir`` served by its family's runner (``kw``: ``max_frames`` /
        ``sampling``).

        Raises CheckpointError: not loadable (a missing tensor is named); ValueError: no registered family's
        checkpoint."""
        from omniduplex.pipeline.speech.registry import load_runner

        return cls(
            load_runner(model_dir, max_num_seqs=max_num_seqs, num_blocks=num_blocks, lever=lever), **kw
        )

    def describe(self) -> dict:
        r = self.runner
        return {
            "family": r.family,
            "voices": [{"name": v.name, "cloned": v.cloned} for v in r.voices()],
            "cloning": r.cloning,
            "instructions": r.instructions,
            "sample_rate": r.sample_rate,
            "ref_sample_rate": r.ref_rate if r.cloning else None,
        }

    def prepare(self, request: SpeechParams):
        """Check one request and build its prompt. Raises SpeechError naming the field at fault."""
        ref = decode_clip(request.ref_audio) if request.ref_audio is not None else None
        try:
            r = request
            return self.runner.prompt(r.text, r.voice, ref, r.ref_text, r.instructions, r.language)
        except TTSInputError as e:
            raise SpeechError(str(e), e.param, e.code) from e

    def _add(self, request_id: str, prompt) -> None:
        try:
            self.runner.add(request_id, prompt, self.max_frames, self.sampling)
        except TTSInputError as e:
            raise SpeechError(str(e), e.param, e.code) from e

    def _decoder(self, prompt):
        return self.runner.rate_decoder(prompt, SPEECH_RATE)

    def _pieces(self, state, ev) -> list[np.ndarray]:
        pcm = self.runner.rate_pcm(state, ev)
        return [pcm] if pcm.size else []
