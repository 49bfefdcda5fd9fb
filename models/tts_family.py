"""Which TTS family a checkpoint folder holds, read from its ``config.json`` (no weights loaded).

The keys each family's published config carries: Qwen3-TTS
``architectures: [Qwen3TTSForConditionalGeneration]``, VoxCPM2 ``architecture: voxcpm2``, Higgs Audio v3
``architectures: [HiggsMultimodalQwen3ForConditionalGeneration]``, Fish Speech S2 Pro
``model_type: fish_qwen3_omni`` (each family's ``is_*`` test).
"""

from __future__ import annotations

from pathlib import Path

QWEN3_TTS, VOXCPM2, HIGGS, FISH_SPEECH = "qwen3-tts", "voxcpm2", "higgs", "fish-speech"
FAMILIES = (QWEN3_TTS, VOXCPM2, HIGGS, FISH_SPEECH)
"""The TTS families a speech service or the cascade's TTS stage can run (names as ``init-model --arch``)."""


def tts_family(model_dir: str | Path) -> str | None:
    """The family of the checkpoint in ``model_dir`` (one of :data:`FAMILIES`), or ``None`` when the folder
    holds none of them (no or unreadable ``config.json``, another architecture)."""
    from omniduplex.models.fish_speech.load import is_fish_speech
    from omniduplex.models.higgs.model import is_higgs
    from omniduplex.models.qwen3_tts.model import is_qwen3_tts
    from omniduplex.models.voxcpm2.model import is_voxcpm2

    d = Path(model_dir)
    if not d.is_dir():
        return None
    for name, test in ((QWEN3_TTS, is_qwen3_tts), (VOXCPM2, is_voxcpm2), (HIGGS, is_higgs)):
        if test(d):
            return name
    return FISH_SPEECH if is_fish_speech(d) else None
