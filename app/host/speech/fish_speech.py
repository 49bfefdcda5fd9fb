"""Fish Speech S2 Pro behind ``POST /v1/audio/speech`` (:class:`~.family.FamilySpeech` over
:class:`~omniduplex.pipeline.speech.family_runner.FishRunner`): 44.1 kHz DAC audio resampled to 24 kHz,
slow AR on the
q_len = 1 decode fast path, the fast AR on buffers allocated once.

Fields: ``voice`` ``default`` or a registered clone; ``ref_audio`` a 44.1 kHz clip (≥ 1 s) cloned for this
request with ``ref_text`` its transcript (required). Sampling keys: ``temperature``, ``top_k``, ``top_p``,
``seed``.
"""

from __future__ import annotations

from pathlib import Path

from omniduplex.app.host.speech.family import FamilySpeech
from omniduplex.pipeline.speech.family_runner import FishRunner


class FishSpeechSpeech(FamilySpeech):
    """A Fish Speech S2 Pro checkpoint serving speech (``kw``: :class:`FamilySpeech`'s ``max_frames`` /
    ``sampling``).

    Raises CheckpointError: not loadable (a missing tensor is named)."""

    def __init__(
        self, model_dir: str | Path, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True, **kw
    ) -> None:
        super().__init__(
            FishRunner(model_dir, max_num_seqs=max_num_seqs, num_blocks=num_blocks, lever=lever), **kw
        )
