"""The talker prompt of one Qwen3-TTS request: prefill embeddings, the text still to feed while decoding,
and the ``tts_pad`` embedding fed once the text is used up.

Layout (``Qwen3TTSForConditionalGeneration.generate`` of qwen-tts 0.1.1; ``ids`` is the chat-format text
``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``: 3 role tokens, the text, 5 tail
tokens; every text embedding goes through ``text_projection``):

1. optional instruction (``<|im_start|>user\\n{instruct}<|im_end|>\\n``, VoiceDesign / CustomVoice), as is;
2. the 3 role tokens;
3. codec control tokens, each added to a text embedding: ``tts_pad`` × (n − 2), then ``tts_bos``, over
   codec ids ``[nothink, think_bos, think_eos]`` (language ``auto``) or ``[think, think_bos, language,
   think_eos]``, then the speaker embedding (a speaker id's codec embedding, or the Base x-vector), then
   ``codec_pad``; the last codec id ``codec_bos`` goes with the first text token (step 4);
4. streaming (default): first text token + ``codec_bos``; the rest of the text and ``tts_eos`` are fed one
   per decode step. Non-streaming: all text + ``tts_eos`` over ``codec_pad``, then ``tts_pad`` +
   ``codec_bos``.
   In-context cloning (Base with reference codes): the reference transcript and the text (+ ``tts_eos``)
   over ``[codec_bos, reference frames]`` (frame = sum of its G code embeddings), aligned from the start;
   the longer side's remainder is fed while decoding (text) or padded with ``tts_pad`` (codes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniduplex.models.qwen3_tts.talker import Talker

ROLE_TOKENS, TAIL_TOKENS, REF_TAIL_TOKENS = 3, 5, 2


@dataclass
class TalkerPrompt:
    """``prefill`` ``[P, H]``; ``trailing`` ``[N, H]`` (decode step ``k ≥ 1`` adds ``trailing[k − 1]``, or
    ``tts_pad`` ``[H]`` past the end)."""

    prefill: torch.Tensor
    trailing: torch.Tensor
    tts_pad: torch.Tensor

    def step_text(self, k: int) -> torch.Tensor:
        """The text embedding added at decode step ``k ≥ 1`` ``[H]``."""
        return self.trailing[k - 1] if k - 1 < self.trailing.shape[0] else self.tts_pad


class PromptError(ValueError):
    """A request the checkpoint cannot serve (unknown speaker or language, cloning on a non-Base model...)."""


def _ids(x: list[int] | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.long).reshape(-1)


@torch.no_grad()
def build_prompt(
    talker: Talker,
    ids: list[int] | torch.Tensor,
    language: str = "auto",
    speaker: str | None = None,
    instruct_ids: list[int] | torch.Tensor | None = None,
    xvector: torch.Tensor | None = None,
    ref_ids: list[int] | torch.Tensor | None = None,
    ref_codes: torch.Tensor | None = None,
    non_streaming: bool = False,
) -> TalkerPrompt:
    """Build the prompt (see module docstring).

    Args:
        ids: chat-format text ids (3 role + text + 5 tail tokens; at least 1 text token).
        language: ``auto`` or a key of ``codec_language_id``; a dialect speaker with ``chinese``/``auto``
            uses its dialect's id.
        speaker: a ``spk_id`` name (CustomVoice); ``None`` for VoiceDesign / Base.
        instruct_ids: chat-format instruction ids (``<|im_start|>user\\n...<|im_end|>\\n``) or ``None``.
        xvector: ``[H]`` speaker-encoder output (Base); replaces ``speaker``.
        ref_ids: chat-format reference transcript (3 role + text + 2 tail tokens), with ``ref_codes``.
        ref_codes: int ``[F, G]`` codec frames of the reference clip (Base in-context cloning).
        non_streaming: feed the whole text in the prefill instead of one token per step.

    Raises:
        PromptError: unknown speaker or language, text too short, cloning inputs on a model that is not
            Base, ``ref_codes`` without ``ref_ids`` or an x-vector, or ids outside the text vocabulary.
    """
    cfg = talker.cfg
    ids = _ids(ids)
    if ids.shape[0] < ROLE_TOKENS + TAIL_TOKENS + 1:
        raise PromptError(f"text ids need 3 role + >= 1 text + 5 tail tokens, got {ids.shape[0]}")
    if (xvector is not None or ref_codes is not None) and cfg.variant != "base":
        raise PromptError(f"voice cloning needs a Base checkpoint; this one is {cfg.variant}")
    if ref_codes is not None and (ref_ids is None or xvector is None):
        raise PromptError("in-context cloning needs ref_ids, ref_codes and the x-vector together")
    codec = talker.codec_embed
    text = talker.text_embed
    ci = cfg.codec_ids
    try:
        spk_embed = None
        if xvector is not None:
            spk_embed = xvector.reshape(1, -1).to(talker.codec_head.weight.dtype)
        elif speaker:
            if speaker.lower() not in cfg.speakers:
                raise PromptError(f"unknown speaker {speaker!r}; this model has {sorted(cfg.speakers)}")
            spk_embed = codec(_ids([cfg.speakers[speaker.lower()]]))
        lang = language.lower()
        if lang == "auto":
            lang_id = None
        elif lang in cfg.languages:
            lang_id = cfg.languages[lang]
        else:
            raise PromptError(
                f"unknown language {language!r}; this model has {['auto', *sorted(cfg.languages)]}"
            )
        if lang in ("chinese", "auto") and speaker and xvector is None:
            dialect = cfg.speaker_dialect.get(speaker.lower(), False)
            if dialect is not False:
                lang_id = cfg.languages[str(dialect).lower()]
        tts_bos, tts_eos, tts_pad = text(
            _ids([cfg.text_ids["tts_bos"], cfg.text_ids["tts_eos"], cfg.text_ids["tts_pad"]])
        ).chunk(3, dim=0)
        tags = [ci["nothink"], ci["think_bos"], ci["think_eos"]]
        if lang_id is not None:
            tags = [ci["think"], ci["think_bos"], lang_id, ci["think_eos"]]
        codec_in = [codec(_ids(tags))] + ([spk_embed] if spk_embed is not None else [])
        codec_in = torch.cat(codec_in + [codec(_ids([ci["pad"], ci["bos"]]))], dim=0)  # [C, H]
        n = codec_in.shape[0]
        control = torch.cat((tts_pad.expand(n - 2, -1), tts_bos), dim=0) + codec_in[:-1]
        parts = []
        if instruct_ids is not None:
            parts.append(text(_ids(instruct_ids)))
        parts += [text(ids[:ROLE_TOKENS]), control]
        body = ids[ROLE_TOKENS:-TAIL_TOKENS]
        if ref_codes is not None:
            ref_body = _ids(ref_ids)[ROLE_TOKENS:-REF_TAIL_TOKENS]
            icl, trailing = _in_context(talker, body, ref_body, ref_codes, tts_pad, tts_eos, non_streaming)
            parts.append(icl)
        elif non_streaming:
            all_text = torch.cat((text(body), tts_eos), dim=0) + codec(
                _ids([ci["pad"]] * (body.shape[0] + 1))
            )
            parts += [all_text, tts_pad + codec(_ids([ci["bos"]]))]
            trailing = tts_pad
        else:
            parts.append(text(body[:1]) + codec_in[-1:])
            trailing = torch.cat((text(ids[ROLE_TOKENS + 1 : -TAIL_TOKENS]), tts_eos), dim=0)
    except ValueError as e:  # text ids outside the vocabulary
        if isinstance(e, PromptError):
            raise
        raise PromptError(str(e)) from e
    return TalkerPrompt(torch.cat(parts, dim=0), trailing, tts_pad[0])


def _in_context(
    talker: Talker,
    body: torch.Tensor,
    ref_body: torch.Tensor,
    ref_codes: torch.Tensor,
    tts_pad: torch.Tensor,
    tts_eos: torch.Tensor,
    non_streaming: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-context cloning block ``[L, H]`` and the trailing text ``[N, H]``."""
    ci = talker.cfg.codec_ids
    g = talker.cfg.num_code_groups
    ref_codes = torch.as_tensor(ref_codes, dtype=torch.long)
    if ref_codes.dim() != 2 or ref_codes.shape[1] != g or ref_codes.shape[0] < 1:
        raise PromptError(f"ref_codes must be [frames >= 1, {g}], got {tuple(ref_codes.shape)}")
    text = torch.cat((talker.text_embed(torch.cat((ref_body, body))), tts_eos), dim=0)
    codes = torch.cat((talker.codec_embed(_ids([ci["bos"]])), talker.frame_embedding(ref_codes)), dim=0)
    nt, nc = text.shape[0], codes.shape[0]
    if non_streaming:
        over_pad = text + talker.codec_embed(_ids([ci["pad"]] * nt))
        return torch.cat((over_pad, codes + tts_pad), dim=0), tts_pad
    if nt > nc:
        return text[:nc] + codes, text[nc:]
    return torch.cat([text] + [tts_pad] * (nc - nt), dim=0) + codes, tts_pad
