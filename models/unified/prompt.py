"""Conversation prompts of the unified LM as step tokens ``[P, S]``: text turns plus the user's speech.

Layout (plain-text roles, as the presets' tokenizer has no chat template)::

    <bos> [system: {system}\\n] [{role}: {text}\\n]... user: [{text}] <speech steps> \\nassistant:

Text steps carry their id in slot 0 and ``-1`` (absent) elsewhere. The user's speech — DAC codes
``[S, F]`` of its first ``S`` codebooks — enters as ``F + S − 1`` audio steps in the same delay pattern
the model speaks in (stream ``i`` shifted by ``i`` steps, its pad id filling the gaps; OpusLM /
ESPnet-SpeechLM), with each code mapped to its stream's region of the flat vocabulary. A step's input
embedding is the sum of its tokens' embeddings (:meth:`.unified.UnifiedLM.embed_step`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

from omniduplex.models.unified.delay_pattern import interleave
from omniduplex.models.unified.model import UnifiedConfig, text_steps


def speech_steps(cfg: UnifiedConfig, codes: torch.Tensor) -> torch.Tensor:
    """Local codes int64 ``[S, F]`` (``0 <= c < codebook_size``) → flat step tokens ``[F + S − 1, S]``.

    Raises:
        ValueError: wrong number of streams, or a code outside ``[0, codebook_size)``.
    """
    s = cfg.num_streams
    if codes.dim() != 2 or codes.shape[0] != s:
        raise ValueError(f"speech codes must be [S={s}, F], got {list(codes.shape)}")
    if codes.numel() and not bool(((codes >= 0) & (codes < cfg.codebook_size)).all()):
        raise ValueError(f"speech codes must lie in [0, {cfg.codebook_size})")
    offsets = torch.tensor([cfg.stream_offset(i) for i in range(s)], dtype=torch.int64)[:, None]
    pads = [cfg.audio_pad_id(i) for i in range(s)]
    return interleave(codes.to(torch.int64) + offsets, pads).T.contiguous()


def conversation_steps(
    cfg: UnifiedConfig,
    tok: Tokenizer,
    speech_codes: torch.Tensor | None = None,
    user_text: str = "",
    history: Sequence[tuple[str, str]] = (),
    system_prompt: str | None = None,
) -> torch.Tensor:
    """The prompt of one assistant turn (module docstring) as int64 step tokens ``[P, S]``.

    Args:
        speech_codes: the user's speech, local codes ``[S, F]``, or ``None`` for a text-only turn.
        user_text: text of the user turn (before the speech, if both).
        history: earlier ``(role, text)`` turns, oldest first.
        system_prompt: optional system text.

    Raises:
        ValueError: from :func:`speech_steps`.
    """

    def text(t: str) -> torch.Tensor:
        return text_steps(tok.encode(t, add_special_tokens=False).ids, cfg.num_streams)

    head = "".join(
        [f"system: {system_prompt}\n" if system_prompt else ""]
        + [f"{role}: {t}\n" for role, t in history]
        + [f"user: {user_text}"]
    )
    parts = [text_steps([cfg.bos_token_id], cfg.num_streams), text(head)]
    if speech_codes is not None and speech_codes.shape[-1] > 0:
        parts.append(speech_steps(cfg, speech_codes))
    parts.append(text("\nassistant: "))
    return torch.cat(parts)
