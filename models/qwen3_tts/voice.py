"""The voice of a Qwen3-TTS request, checked once and turned into talker prompts for any number of texts.

A voice is what the checkpoint's variant takes (``tts_model_type``): a CustomVoice speaker name (with an
optional style instruction), a VoiceDesign description, or for Base a reference clip to clone (24 kHz, at
least :data:`MIN_REF_SECONDS`; its x-vector, and with its transcript the clip's codec frames in context).
The speech API (``app/host/speech/qwen3.py``) and the cascade's TTS stage
(``pipeline/stages/qwen3_tts_stage.py``)
share these checks; the conditioning (x-vector, reference codes) is computed once per voice, not per text.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import torch
from tokenizers import Tokenizer

from omniduplex.models.qwen3_tts import text as tts_text
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE, Qwen3TTS
from omniduplex.models.qwen3_tts.prompt import PromptError, TalkerPrompt, build_prompt

MIN_REF_SECONDS = 1.0
"""Shortest reference clip accepted for cloning (s); our bound: the speaker encoder's x-vector pools over
the clip's mel frames, and under a second of speech says little about a voice."""


class VoiceError(PromptError):
    """A request this checkpoint cannot serve; ``param`` names the request field at fault and ``code`` is the
    OpenAI-style error code."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def read_ref_audio(data: bytes, param: str = "ref_audio") -> np.ndarray:
    """A WAV (any format libsndfile reads) → float32 mono ``[n]`` at 24 kHz (channels averaged).

    Raises VoiceError: not audio, a rate other than 24 kHz, or shorter than :data:`MIN_REF_SECONDS`.
    """
    try:
        wav, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (ValueError, RuntimeError, sf.LibsndfileError) as e:
        raise VoiceError(f"{param} is not an audio file: {e}", param) from e
    if rate != SAMPLE_RATE:
        raise VoiceError(f"{param} is {rate} Hz; send {SAMPLE_RATE} Hz audio", param)
    if wav.shape[0] < MIN_REF_SECONDS * SAMPLE_RATE:
        raise VoiceError(
            f"{param} is {wav.shape[0] / SAMPLE_RATE:.2f} s; send at least {MIN_REF_SECONDS:g} s", param
        )
    return wav.mean(axis=1)


@dataclass
class Voice:
    """A checked voice: the prompt-builder arguments that do not depend on the text."""

    speaker: str | None = None
    instruct_ids: list[int] | None = None
    language: str = "auto"
    xvector: torch.Tensor | None = None
    ref_ids: list[int] | None = None
    ref_codes: torch.Tensor | None = None


class VoicePrompter:
    """Checks voices and builds prompts for one loaded checkpoint (talker, and for Base the speaker encoder
    and, for in-context cloning, the codec encoder).

    Args:
        model, tok: the checkpoint and its tokenizer.
        context: positions a request may use (prompt + frames); a prompt must leave at least one frame.
    """

    def __init__(self, model: Qwen3TTS, tok: Tokenizer, context: int) -> None:
        self.model, self.tok, self.context = model, tok, context
        self.variant = model.config.variant

    @property
    def voices(self) -> list[str]:
        """CustomVoice speaker names (empty for the other variants)."""
        return sorted(self.model.config.speakers)

    @torch.no_grad()
    def voice(
        self,
        voice: str | None = None,
        instructions: str | None = None,
        language: str = "auto",
        ref_wav: np.ndarray | None = None,
        ref_text: str | None = None,
    ) -> Voice:
        """Check a voice for this checkpoint. ``voice`` is ignored by VoiceDesign and Base (no named
        speakers); ``ref_wav``: float32 24 kHz ``[n]`` (:func:`read_ref_audio`).

        Raises VoiceError: an unknown speaker or language, cloning asked of a non-Base checkpoint, Base
        without a clip, VoiceDesign without instructions, Base with instructions, ``ref_text`` alone.
        """
        if (ref_wav is not None or ref_text is not None) and self.variant != "base":
            raise VoiceError(
                f"voice cloning (ref_audio / ref_text) needs a Base checkpoint; this one is {self.variant}",
                "ref_audio",
            )
        if self.variant == "base" and ref_wav is None:
            raise VoiceError(
                "this Base checkpoint clones a voice: send ref_audio (and ref_text)", "ref_audio"
            )
        if ref_text is not None and ref_wav is None:
            raise VoiceError("ref_text needs ref_audio", "ref_text")
        if self.variant == "voice_design" and not instructions:
            raise VoiceError(
                "this VoiceDesign checkpoint needs instructions describing the voice", "instructions"
            )
        if self.variant == "base" and instructions:
            raise VoiceError("a Base checkpoint takes no instructions", "instructions")
        languages = ["auto", *sorted(self.model.config.languages)]
        if language.lower() not in languages:
            raise VoiceError(f"unknown language {language!r}; this model has {languages}", "language")
        out = Voice(language=language)
        if self.variant == "custom_voice":
            if voice is None or voice.lower() not in self.model.config.speakers:
                said = "no voice" if voice is None else f"unknown voice {voice!r}"
                raise VoiceError(f"{said}; this model has {self.voices}", "voice")
            out.speaker = voice
        if instructions:
            out.instruct_ids = tts_text.instruct_ids(self.tok, instructions)
        if ref_wav is not None:
            wav = torch.from_numpy(np.ascontiguousarray(ref_wav, dtype=np.float32))
            out.xvector = self.model.speaker_encoder.embed(wav)
            if ref_text is not None:
                if self.model.codec_encoder is None:
                    raise VoiceError("this checkpoint has no codec encoder: send ref_audio alone", "ref_text")
                try:
                    out.ref_ids = tts_text.ref_text_ids(self.tok, ref_text)
                except PromptError as e:
                    raise VoiceError(str(e), "ref_text") from e
                out.ref_codes = self.model.codec_encoder.encode(wav)
        return out

    @torch.no_grad()
    def prompt(self, text: str, voice: Voice) -> TalkerPrompt:
        """The talker prompt of ``text`` in ``voice``.

        Raises VoiceError: empty text, text outside the vocabulary, or a prompt that leaves no room in
        the context (code ``context_length_exceeded``).
        """
        try:
            p = build_prompt(
                self.model.talker,
                tts_text.text_ids(self.tok, text),
                language=voice.language,
                speaker=voice.speaker,
                instruct_ids=voice.instruct_ids,
                xvector=voice.xvector,
                ref_ids=voice.ref_ids,
                ref_codes=voice.ref_codes,
            )
        except VoiceError:
            raise
        except PromptError as e:
            raise VoiceError(str(e), "input") from e
        used = p.prefill.shape[0] + p.trailing.shape[0]
        if used >= self.context:
            raise VoiceError(
                f"input is past the context: the prompt takes {used} positions of {self.context}",
                "input",
                "context_length_exceeded",
            )
        return p
