"""The prompt of one Higgs Audio v3 request, and its voices.

Layout (sglang-omni ``higgs_tts/text_tokenizer.py``, the v3 serving stack; tokens are the checkpoint
tokenizer's added specials):

- zero-shot: ``<|tts|> <|text|> tok(text) <|audio|>``
- cloning: ``<|tts|> [<|ref_text|> tok(transcript)] <|ref_audio|> R <|text|> tok(text) <|audio|>``

where ``R`` is the reference clip's ``T`` frames in the delay pattern, ``T + N − 1`` audio rows (codebook
``i`` shifted by ``i`` rows, BOC before and EOC after its codes; config ``audio_token_id`` (−100) marks
these rows in the published prompt ids). A voice (what a request's ``voice`` means):

- a named built-in voice: ``voices.json`` in the checkpoint folder, ``{name: {"text": transcript, "codes":
  [[N ids] × T]}}`` (the reference clip already encoded by the audio tokenizer);
- cloning from the caller's own reference: its codes ``[T, N]`` (from ``HiggsAudioV2TokenizerModel.encode``)
  and transcript. A raw reference clip is checked (24 kHz, at least :data:`MIN_REFERENCE_SECONDS`) and then
  refused: encoding it needs the tokenizer's encoder (HuBERT semantic model + DAC encoder), which this
  build does not carry.

v3 has no scene description or instruction prompt: style and emotion are inline tags in the text itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from omniduplex.models.higgs.config import HiggsConfig
from omniduplex.models.unified.delay_pattern import interleave, step_validity

SPECIAL_TOKENS = ("<|tts|>", "<|ref_text|>", "<|ref_audio|>", "<|text|>", "<|audio|>")
VOICES_FILE = "voices.json"
MIN_REFERENCE_SECONDS = 1.0


class PromptError(ValueError):
    """A request the checkpoint cannot serve (unknown voice, bad reference, empty or overlong text)."""


@dataclass
class Voice:
    """A reference voice: its codes int64 ``[T, N]`` (un-delayed, ids ``< codebook_size``) and transcript."""

    name: str
    codes: torch.Tensor
    text: str | None = None


@dataclass
class HiggsPrompt:
    """Prompt rows: ``ids`` int64 ``[P]`` (text id, or ``-1`` for an audio row) and ``codes`` int64 ``[P, N]``
    (the audio row's codes, ``-1`` on text rows)."""

    ids: torch.Tensor
    codes: torch.Tensor

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """The v3 specials' ids. Raises PromptError when the tokenizer lacks one (not a v3 TTS tokenizer)."""
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None and t != "<|ref_text|>"]
    if missing:
        raise PromptError(f"the tokenizer has no Higgs TTS special tokens {missing}")
    return ids


def delayed_reference(codes: torch.Tensor, cfg: HiggsConfig) -> torch.Tensor:
    """Reference codes ``[T, N]`` → its delayed rows int64 ``[T + N − 1, N]``: BOC before each codebook's
    first code, EOC after its last (sglang-omni ``apply_delay_pattern``)."""
    rows = interleave(codes.T.to(torch.int64), cfg.eoc_id).T.clone()
    lead = ~step_validity(torch.arange(rows.shape[0]), cfg.num_codebooks)  # step a, codebook i > a
    rows[lead] = cfg.boc_id
    return rows


def check_codes(codes: torch.Tensor, cfg: HiggsConfig, what: str = "reference codes") -> torch.Tensor:
    """``codes`` as int64 ``[T, N]``. Raises PromptError for a wrong shape, no frames or an id outside
    ``[0, codebook_size)``."""
    codes = torch.as_tensor(codes)
    n = cfg.num_codebooks
    if codes.dim() != 2 or codes.shape[1] != n or codes.shape[0] == 0:
        raise PromptError(f"{what} must be [T >= 1, {n}] codes, got shape {list(codes.shape)}")
    if codes.dtype.is_floating_point or int(codes.min()) < 0 or int(codes.max()) >= cfg.codebook_size:
        raise PromptError(f"{what}: ids must be integers in [0, {cfg.codebook_size})")
    return codes.to(torch.int64)


def check_reference_audio(audio, sample_rate: int, cfg: HiggsConfig) -> None:
    """Validate a raw reference clip, then refuse it (module docstring). Always raises PromptError."""
    if sample_rate != cfg.sample_rate:
        raise PromptError(f"reference audio must be {cfg.sample_rate} Hz, got {sample_rate} Hz")
    seconds = len(audio) / sample_rate
    if seconds < MIN_REFERENCE_SECONDS:
        raise PromptError(f"reference audio is {seconds:.2f} s; at least {MIN_REFERENCE_SECONDS} s is needed")
    raise PromptError(
        "cloning from a raw clip needs the audio tokenizer's encoder (HuBERT + DAC encoder), not in this "
        "build: pass the clip's codes (ref_codes) or a named voice"
    )


def load_voices(model_dir: str | Path, cfg: HiggsConfig) -> dict[str, Voice]:
    """The checkpoint's built-in voices (``{}`` without ``voices.json``).

    Raises PromptError for an entry whose codes are not ``[T, N]`` ids of the codebook."""
    path = Path(model_dir) / VOICES_FILE
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {
        name: Voice(
            name, check_codes(torch.tensor(v["codes"]), cfg, f"voice {name!r}"), v.get("text") or None
        )
        for name, v in raw.items()
    }


def build_prompt(
    tok: Tokenizer,
    cfg: HiggsConfig,
    text: str,
    voice: Voice | None = None,
    max_len: int | None = None,
) -> HiggsPrompt:
    """The rows of one request (module docstring).

    Raises:
        PromptError: empty text, bad reference codes, or a prompt of ``max_len`` rows or more (text past the
            context: no room left to speak).
    """
    sp = special_ids(tok)
    body = tok.encode(text, add_special_tokens=False).ids
    if not text.strip() or not body:
        raise PromptError("nothing to say: the text is empty")
    ids: list[int] = [sp["<|tts|>"]]
    ref = None
    if voice is not None:
        ref = delayed_reference(check_codes(voice.codes, cfg, f"voice {voice.name!r}"), cfg)
        if voice.text and sp["<|ref_text|>"] is not None:
            ids += [sp["<|ref_text|>"], *tok.encode(voice.text, add_special_tokens=False).ids]
        ids.append(sp["<|ref_audio|>"])
    head = len(ids)
    tail = [sp["<|text|>"], *body, sp["<|audio|>"]]
    n_ref = 0 if ref is None else ref.shape[0]
    total = head + n_ref + len(tail)
    if max_len is not None and total >= max_len:
        raise PromptError(f"text past the context: the prompt has {total} rows, the context holds {max_len}")
    all_ids = torch.tensor(ids + [-1] * n_ref + tail, dtype=torch.int64)
    codes = torch.full((total, cfg.num_codebooks), -1, dtype=torch.int64)
    if ref is not None:
        codes[head : head + n_ref] = ref
    return HiggsPrompt(all_ids, codes)
