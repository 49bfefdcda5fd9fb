"""VoxCPM2 voices and prompts: text ids, reference-clip latents, and the base-LM prompt of one request.

A request's prompt is a sequence of rows, each a text id or a latent patch (``VoxCPM2Model._generate_with_
prompt_cache`` of ``voxcpm`` 2.0.3), in one of four layouts chosen by the voice:

- plain (the default voice): ``text … <audio_start>``;
- reference (a registered clip, isolated as a prefix): ``<ref_audio_start> clip patches <ref_audio_end>
  text … <audio_start>``;
- continuation (a clip and its transcript): ``transcript + text … <audio_start> clip patches`` (the model
  continues the clip's speech);
- both: the reference prefix, then the continuation layout.

The clip patches come from the AudioVAE encoder (16 kHz, zero-padded to whole patches: after the clip as a
reference, before it as a continuation prompt) and are embedded once per voice (LocEnc); a voice's reference
prefix is the same rows for every request, so the engine's prefix cache shares its KV. Text ids come from
the checkpoint's ``tokenizer.json`` with multi-character CJK tokens split into characters, as the
reference's ``mask_multichar_chinese_tokens`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from omniduplex.models.voxcpm2.audio_vae import AudioVAE
from omniduplex.models.voxcpm2.config import (
    AUDIO_START_ID,
    REF_AUDIO_END_ID,
    REF_AUDIO_START_ID,
)
from omniduplex.models.voxcpm2.model import VoxCPM2Model

AUDIO_ROW = -1
"""Prompt id of a latent-patch row (the rows' content keys the prefix cache; the reference uses 0)."""
DEFAULT_VOICE = "default"
MIN_CLIP_SECONDS = 0.5
"""Shortest reference clip accepted (s); our bound: three patches (0.48 s) are what the decoder keeps as
context of a continuation, and less says little about a voice."""
MAX_LEN_RATIO, MAX_LEN_EXTRA = 6.0, 10
"""Patch budget of a text of ``n`` ids: ``int(n · 6 + 10)`` (``retry_badcase_ratio_threshold`` + 10)."""
CONTEXT_PATCHES = 3
"""Continuation: prompt patches decoded ahead of the output (``streaming_prefix_len − 1``), dropped."""


class PromptError(ValueError):
    """A request this checkpoint cannot serve (unknown voice, bad clip, empty text, past the context)."""


def _is_cjk(s: str) -> bool:
    return all("\u4e00" <= c <= "\u9fff" for c in s)


class TextTokenizer:
    """Text → ids: ``tokenizer.json`` without special tokens; a token that is two or more CJK characters
    (after dropping the Metaspace ``▁``) becomes one id per character (the unknown id where a character has
    none), as ``mask_multichar_chinese_tokens`` of ``voxcpm`` 2.0.3."""

    def __init__(self, tok: Tokenizer, unk_id: int = 0) -> None:
        self.tok, self.unk_id = tok, unk_id
        self.multichar = {t for t in tok.get_vocab() if len(t) >= 2 and _is_cjk(t)}

    def __call__(self, text: str) -> list[int]:
        ids: list[int] = []
        enc = self.tok.encode(text, add_special_tokens=False)
        for token, i in zip(enc.tokens, enc.ids):
            clean = token.replace("▁", "")
            if clean in self.multichar:
                ids.extend(self._id(c) for c in clean)
            else:
                ids.append(i)
        return ids

    def _id(self, token: str) -> int:
        i = self.tok.token_to_id(token)
        return self.unk_id if i is None else i


@dataclass
class Voice:
    """A voice's conditioning, computed once: latent patches ``[n, P, D]`` and their base-LM rows ``[n, H]``
    of a reference clip and/or a continuation clip (with its transcript)."""

    name: str
    ref_feats: torch.Tensor | None = None
    ref_embeds: torch.Tensor | None = None
    prompt_feats: torch.Tensor | None = None
    prompt_embeds: torch.Tensor | None = None
    prompt_text: str = ""


@dataclass
class VoxPrompt:
    """The base-LM prompt of one request.

    Attributes:
        ids: ``[L]`` text ids, :data:`AUDIO_ROW` on patch rows.
        embeds: ``[L, H]`` input rows (text embeddings or patch embeddings).
        audio: bool ``[L]`` patch rows.
        cond: ``[P, D]`` the first DiT call's previous patch (the last row's patch; zeros after text).
        context: ``[k, P, D]`` patches the waveform decoder runs ahead of the output (continuation; k ≤ 3).
        max_patches: patch budget (:data:`MAX_LEN_RATIO`).
    """

    ids: list[int]
    embeds: torch.Tensor
    audio: torch.Tensor
    cond: torch.Tensor
    context: torch.Tensor
    max_patches: int


def clip_patches(vae: AudioVAE, wav: np.ndarray | torch.Tensor, patch: int, pad_left: bool) -> torch.Tensor:
    """A 16 kHz mono clip → latent patches ``[n, P, D]`` (zeros before (``pad_left``) or after it up to whole
    patches, as ``VoxCPM2Model._encode_wav``)."""
    x = torch.as_tensor(np.asarray(wav, dtype=np.float32)).reshape(1, -1)
    span = patch * vae.cfg.hop_length
    pad = -x.shape[1] % span
    x = torch.nn.functional.pad(x, (pad, 0) if pad_left else (0, pad))
    z = vae.encode(x)[0]  # [D, frames]
    return z.reshape(z.shape[0], -1, patch).permute(1, 2, 0).contiguous()


def check_clip(wav: np.ndarray, rate: int, expected: int) -> np.ndarray:
    """A clip as float32 mono ``[n]``. Raises PromptError: not 1-D, the wrong rate, or too short."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise PromptError(f"a voice clip must be mono [samples], got shape {list(wav.shape)}")
    if rate != expected:
        raise PromptError(f"a voice clip must be {expected} Hz; got {rate} Hz")
    if wav.shape[0] < MIN_CLIP_SECONDS * expected:
        raise PromptError(
            f"a voice clip must be at least {MIN_CLIP_SECONDS:g} s; got {wav.shape[0] / expected:.2f} s"
        )
    return wav


@torch.no_grad()
def make_voice(
    lm: VoxCPM2Model,
    vae: AudioVAE,
    name: str,
    reference: tuple[np.ndarray, int] | None = None,
    prompt: tuple[np.ndarray, int] | None = None,
    prompt_text: str = "",
) -> Voice:
    """A voice from a reference clip and/or a continuation clip with its transcript (``(wav, rate)`` each).

    Raises PromptError: neither clip, a transcript without its clip or a clip without one, or a clip
    :func:`check_clip` refuses.
    """
    if reference is None and prompt is None:
        raise PromptError(
            f"voice {name!r}: give a reference clip, a prompt clip with its transcript, or both"
        )
    if (prompt is None) != (not prompt_text):
        raise PromptError(f"voice {name!r}: a prompt clip and its transcript go together")
    v = Voice(name, prompt_text=prompt_text)
    rate, patch = vae.cfg.sample_rate, lm.cfg.patch_size
    dtype = lm.enc_to_lm_proj.weight.dtype
    if reference is not None:
        v.ref_feats = clip_patches(vae, check_clip(reference[0], reference[1], rate), patch, pad_left=False)
        v.ref_embeds = lm.patch_embed(v.ref_feats.to(dtype))
    if prompt is not None:
        v.prompt_feats = clip_patches(vae, check_clip(prompt[0], prompt[1], rate), patch, pad_left=True)
        v.prompt_embeds = lm.patch_embed(v.prompt_feats.to(dtype))
    return v


@torch.no_grad()
def build_prompt(
    lm: VoxCPM2Model, tok: TextTokenizer, text: str, voice: Voice | None, context: int, max_len: int = 2000
) -> VoxPrompt:
    """The prompt of ``text`` in ``voice`` (``None``: the plain layout).

    Raises PromptError: empty text, a text id past the vocabulary (tokenizer and model disagree), or a
    prompt plus its patch budget past ``context`` positions.
    """
    target = tok(text)
    if not target:
        raise PromptError("nothing to say: the text is empty")
    cfg = lm.cfg
    dtype = lm.enc_to_lm_proj.weight.dtype
    dev = lm.enc_to_lm_proj.weight.device
    feat_shape = (cfg.patch_size, cfg.feat_dim)
    cont = voice is not None and voice.prompt_feats is not None
    text_ids = (tok(voice.prompt_text + text) if cont else target) + [AUDIO_START_ID]
    if max(text_ids) >= cfg.lm.decoder.vocab_size:
        raise PromptError(
            f"text id {max(text_ids)} is outside the model's vocabulary ({cfg.lm.decoder.vocab_size})"
        )
    rows: list[tuple[str, object]] = []  # ("text", ids) or ("audio", (feats, embeds))
    if voice is not None and voice.ref_feats is not None:
        rows += [("text", [REF_AUDIO_START_ID]), ("audio", (voice.ref_feats, voice.ref_embeds))]
        rows += [("text", [REF_AUDIO_END_ID])]
    rows.append(("text", text_ids))
    if cont:
        rows.append(("audio", (voice.prompt_feats, voice.prompt_embeds)))
    ids: list[int] = []
    embeds, audio, feats = [], [], []
    for kind, part in rows:
        if kind == "text":
            ids += part
            embeds.append(lm.text_embed(torch.tensor(part, device=dev)))
            audio += [False] * len(part)
            feats.append(torch.zeros((len(part), *feat_shape)))
        else:
            f, e = part
            ids += [AUDIO_ROW] * f.shape[0]
            embeds.append(e.to(dtype))
            audio += [True] * f.shape[0]
            feats.append(f.float().cpu())
    feats_all = torch.cat(feats)
    audio_t = torch.tensor(audio)
    budget = min(int(len(target) * MAX_LEN_RATIO + MAX_LEN_EXTRA), max_len)
    if len(ids) + budget > context:
        raise PromptError(
            f"text past the context: the prompt takes {len(ids)} positions and the text may need {budget} "
            f"patches, {context} positions in all"
        )
    context_feats = feats_all[audio_t][-CONTEXT_PATCHES:] if audio[-1] else feats_all[:0]
    return VoxPrompt(ids, torch.cat(embeds), audio_t, feats_all[-1], context_feats, budget)


class VoiceBank:
    """The named voices of one checkpoint: :data:`DEFAULT_VOICE` (no prompt: the plain layout) and clips
    registered under a name (the ``voice`` of a speech request)."""

    def __init__(self, lm: VoxCPM2Model, vae: AudioVAE | None) -> None:
        self.lm, self.vae = lm, vae
        self._voices: dict[str, Voice] = {}

    @property
    def names(self) -> list[str]:
        return [DEFAULT_VOICE, *sorted(self._voices)]

    def register(
        self,
        name: str,
        reference: tuple[np.ndarray, int] | None = None,
        prompt: tuple[np.ndarray, int] | None = None,
        prompt_text: str = "",
    ) -> Voice:
        """Register (or replace) a voice (:func:`make_voice`). Raises PromptError: the default name, no
        AudioVAE loaded, or what :func:`make_voice` refuses (nothing is registered then)."""
        if not name or name == DEFAULT_VOICE:
            raise PromptError(f"voice name {name!r} is reserved or empty")
        if self.vae is None:
            raise PromptError("registering a voice needs the AudioVAE encoder (load the 'vae' part)")
        voice = make_voice(self.lm, self.vae, name, reference, prompt, prompt_text)
        self._voices[name] = voice
        return voice

    def get(self, name: str | None) -> Voice | None:
        """The voice called ``name`` (``None`` for the default). Raises PromptError for an unknown name."""
        if name is None or name == DEFAULT_VOICE:
            return None
        if name not in self._voices:
            raise PromptError(f"unknown voice {name!r}; this model has {self.names}")
        return self._voices[name]
