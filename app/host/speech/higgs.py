"""Higgs Audio v3 behind ``POST /v1/audio/speech`` (:class:`~.family.FamilySpeech` over
:class:`~omniduplex.pipeline.speech.family_runner.HiggsRunner`): 24 kHz audio, 8 codebooks in the delay
pattern, the
decode state batched in one slot table.

Fields: ``voice`` a ``voices.json`` voice of the checkpoint (none: the model's own voice); ``ref_audio`` is
refused with the reason (cloning a raw clip needs the audio tokenizer's encoder, not in this build).
Sampling keys: ``temperature``, ``top_k``, ``top_p``, ``seed``.
"""

from __future__ import annotations

from pathlib import Path

from omniduplex.app.host.speech.family import FamilySpeech
from omniduplex.pipeline.speech.family_runner import HiggsRunner


class HiggsSpeech(FamilySpeech):
    """A Higgs Audio v3 checkpoint serving speech (``kw``: :class:`FamilySpeech`'s ``max_frames`` /
    ``sampling``).

    Raises CheckpointError: not loadable (a missing tensor is named)."""

    def __init__(
        self, model_dir: str | Path, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True, **kw
    ) -> None:
        super().__init__(
            HiggsRunner(model_dir, max_num_seqs=max_num_seqs, num_blocks=num_blocks, lever=lever), **kw
        )
