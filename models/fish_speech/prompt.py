"""A Fish Speech S2 Pro request: its voice and its slow-AR prompt (token ids and input rows).

Voices. The published model has no built-in speakers: without a reference it speaks in a voice of its own
choosing (``voice`` ``None`` or ``"default"``). A cloned voice is a reference clip at the codec's 44.1 kHz
(at least :data:`MIN_REFERENCE_SECONDS`) with its transcript; the DAC encoder turns the clip into codes
(:func:`clone_voice`), which the prompt carries as semantic tokens with their residual codes.

Prompt (vLLM-Omni's ``build_fish_voice_clone_prompt_ids``, the format of Fish Audio's own inference):

    <|im_start|>system\\nconvert the provided text to speech reference to the following:\\n\\nText:\\n
    {<|speaker:0|>ref_text}\\n\\nSpeech:\\n<|audio_start|>{semantic tokens}<|audio_end|><|im_end|>\\n
    <|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n<|voice|>

(the system turn only with a cloned voice; ``\\n`` and the role words as plain text). Text is normalised as
the published builder does: ``<speaker:N>`` becomes ``<|speaker:N|>``, any other ``<|…|>`` control token is
refused, and a transcript without a speaker tag gets ``<|speaker:0|>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from omniduplex.models.codecs.dac_encoder import DacCodecEncoder
from omniduplex.models.fish_speech.config import SAMPLE_RATE
from omniduplex.models.fish_speech.model import FishLM

MIN_REFERENCE_SECONDS = 1.0
DEFAULT_VOICE = "default"
SYSTEM_PREFIX = "convert the provided text to speech reference to the following:\n\nText:\n"
SYSTEM_SUFFIX = "\n\nSpeech:\n"
CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|voice|>")
_LEGACY_SPEAKER = re.compile(r"<speaker:(\d+)>")
_SPEAKER = re.compile(r"<\|speaker:\d+\|>")
_CONTROL = re.compile(r"<\|[^>]+\|>")


class PromptError(ValueError):
    """A request that cannot be spoken as given (unknown voice, bad reference clip, empty text, text past the
    context); the message names the field."""


@dataclass
class FishVoice:
    """A cloned voice: ``codes`` int64 ``[num_codebooks, T]`` of the reference clip and its ``transcript``."""

    name: str
    codes: torch.Tensor
    transcript: str


@dataclass
class FishPrompt:
    """A request's slow-AR prompt: token ``ids`` (``P``) and their input rows ``embeds`` ``[P, dim]``."""

    ids: list[int]
    embeds: torch.Tensor
    voice: str

    def __len__(self) -> int:
        return len(self.ids)


def normalize_text(text: str, default_speaker: bool = False) -> str:
    """The published builder's text rule (module docstring). Raises PromptError on a control token."""
    out = _LEGACY_SPEAKER.sub(r"<|speaker:\1|>", text)
    bad = sorted({t for t in _CONTROL.findall(out) if not _SPEAKER.fullmatch(t)})
    if bad:
        raise PromptError(f"text contains unsupported control token(s) {bad}")
    if default_speaker and not _SPEAKER.search(out):
        out = "<|speaker:0|>" + out
    return out


def clone_voice(
    encoder: DacCodecEncoder, name: str, pcm, sample_rate: int, transcript: str, num_codebooks: int
) -> FishVoice:
    """Encode a reference clip: ``pcm`` float ``[samples]`` in [−1, 1] (tensor or array) at ``sample_rate``
    Hz, spoken as ``transcript``.

    Raises:
        PromptError: a rate other than 44.1 kHz, a clip shorter than :data:`MIN_REFERENCE_SECONDS` or not
            mono, an empty transcript.
    """
    if sample_rate != SAMPLE_RATE:
        raise PromptError(
            f"ref_audio is {sample_rate} Hz; Fish Speech reference clips must be {SAMPLE_RATE} Hz"
        )
    wav = torch.as_tensor(pcm, dtype=torch.float32)
    if wav.dim() != 1:
        raise PromptError(f"ref_audio must be mono [samples], got shape {list(wav.shape)}")
    if wav.shape[0] < MIN_REFERENCE_SECONDS * SAMPLE_RATE:
        raise PromptError(
            f"ref_audio is {wav.shape[0] / SAMPLE_RATE:.2f} s; at least {MIN_REFERENCE_SECONDS:.1f} s needed"
        )
    if not transcript.strip():
        raise PromptError("ref_text (the reference clip's transcript) is empty")
    normalize_text(transcript)
    with torch.no_grad():
        codes = encoder.encode(wav[None, None].to(next(encoder.parameters()).device), num_codebooks)[0]
    return FishVoice(name, codes.cpu(), transcript)


def _ids(tok: Tokenizer, s: str) -> list[int]:
    return tok.encode(s, add_special_tokens=False).ids


def _control(tok: Tokenizer, name: str) -> int:
    i = tok.token_to_id(name)
    if i is None:
        raise PromptError(f"the tokenizer has no {name} token")
    return i


def prompt_ids(
    tok: Tokenizer, text: str, voice: FishVoice | None, semantic_begin_id: int
) -> tuple[list[int], int]:
    """The prompt's token ids and the index of its first semantic token (``-1`` without a voice).

    Raises:
        PromptError: empty text, a control token in the text, or a tokenizer without the control tokens.
    """
    if not text.strip():
        raise PromptError("nothing to say: the text is empty")
    start, end, audio_start, audio_end, voice_tok = (_control(tok, n) for n in CONTROL_TOKENS)
    nl = _ids(tok, "\n")
    body = _ids(tok, normalize_text(text))
    ids: list[int] = []
    first = -1
    if voice is not None:
        ref = normalize_text(voice.transcript, default_speaker=True)
        ids += [start, *_ids(tok, "system\n"), *_ids(tok, SYSTEM_PREFIX + ref + SYSTEM_SUFFIX), audio_start]
        first = len(ids)
        ids += (voice.codes[0] + semantic_begin_id).tolist()
        ids += [audio_end, end, *nl]
    ids += [start, *_ids(tok, "user\n"), *body, end, *nl, start, *_ids(tok, "assistant\n"), voice_tok]
    return ids, first


def build_prompt(lm: FishLM, tok: Tokenizer, text: str, voice: FishVoice | None = None) -> FishPrompt:
    """Token ids and slow-AR input rows of one request (the reference codes in their semantic rows).

    Raises:
        PromptError: as :func:`prompt_ids`, or reference codes that do not fit the model.
    """
    cfg = lm.cfg
    if voice is not None and (voice.codes.dim() != 2 or voice.codes.shape[0] != cfg.num_codebooks):
        raise PromptError(
            f"voice {voice.name!r} has codes {list(voice.codes.shape)}, not [{cfg.num_codebooks}, T]"
        )
    ids, first = prompt_ids(tok, text, voice, cfg.semantic_begin_id)
    dev = lm.model.embeddings.weight.device
    ids_t = torch.tensor(ids, dtype=torch.int64, device=dev)
    codes = None
    if voice is not None:
        codes = torch.zeros((len(ids), cfg.num_codebooks), dtype=torch.int64, device=dev)
        codes[first : first + voice.codes.shape[1]] = voice.codes.t().to(dev)
    try:
        with torch.no_grad():
            rows = lm.input_rows(ids_t, codes)
    except ValueError as e:
        raise PromptError(str(e)) from e
    return FishPrompt(ids, rows, voice.name if voice is not None else DEFAULT_VOICE)
