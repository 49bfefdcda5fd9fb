"""VoxCPM2 behind ``POST /v1/audio/speech`` (:class:`~.family.FamilySpeech` over
:class:`~omniduplex.pipeline.speech.family_runner.VoxCPM2Runner`): 48 kHz audio resampled to 24 kHz, one
patch (160 ms)
per engine step, every due request's flow-matching solve in one call.

Fields: ``voice`` ``default`` or a registered voice; ``ref_audio`` a 16 kHz clip (≥ 0.5 s) cloned for this
request, ``ref_text`` its transcript (then the clip also continues as the prompt, as VoxCPM2's
``prompt_wav_path`` + ``prompt_text``). Sampling keys: ``cfg_value``, ``inference_timesteps``, ``seed``.
"""

from __future__ import annotations

from pathlib import Path

from omniduplex.app.host.speech.family import FamilySpeech
from omniduplex.pipeline.speech.family_runner import VoxCPM2Runner


class VoxCPM2Speech(FamilySpeech):
    """A VoxCPM2 checkpoint serving speech (``kw``: :class:`FamilySpeech`'s ``max_frames`` / ``sampling``).

    Raises CheckpointError: not loadable (a missing tensor is named)."""

    def __init__(
        self, model_dir: str | Path, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True, **kw
    ) -> None:
        super().__init__(
            VoxCPM2Runner(model_dir, max_num_seqs=max_num_seqs, num_blocks=num_blocks, lever=lever), **kw
        )
