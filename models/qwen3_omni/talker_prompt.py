"""How the Talker's inputs are built from the Thinker's outputs (Qwen3-Omni's Thinker→Talker interface).

The Talker sees (a) the user turns of the prompt — text tokens through ``text_projection`` of their
Thinker input embeddings, audio tokens through ``hidden_projection`` of the Thinker hidden state at
``accept_hidden_layer`` — then (b) the assistant header fused with codec control ids, then one
projected Thinker text embedding per decode step ("trailing text"), then ``tts_eos``, then ``tts_pad``.
This mirrors ``Qwen3OmniMoeForConditionalGeneration.generate`` in ``transformers`` so that a streamed
Talker (which starts before the Thinker finishes) produces the same codes.

Streaming rule: Thinker tokens ``g_0 .. g_{n-1}`` (``g_{n-1}`` is EOS or the max-tokens cutoff).
``g_0`` enters the prefill; decode step ``j`` consumes ``g_{j+1}`` while ``j + 1 < n - 1``,
``tts_eos`` at ``j + 1 == n - 1`` and ``tts_pad`` afterwards. The final Thinker token is never spoken.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniduplex.models.config import OmniConfig
from omniduplex.models.qwen3_omni.talker import Talker


@dataclass
class TalkerTextEmbeds:
    """Projected Thinker special-token embeddings, each ``[talker_hidden]``."""

    tts_bos: torch.Tensor
    tts_eos: torch.Tensor
    tts_pad: torch.Tensor


def special_text_embeds(
    talker: Talker, thinker_embed_tokens: torch.nn.Embedding, cfg: OmniConfig
) -> TalkerTextEmbeds:
    """``text_projection`` of the Thinker embeddings of ``tts_bos``, ``tts_eos``, ``tts_pad``."""
    ids = torch.tensor(
        [cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id],
        device=thinker_embed_tokens.weight.device,
    )
    bos, eos, pad = talker.text_projection(thinker_embed_tokens(ids)).unbind(0)
    return TalkerTextEmbeds(bos, eos, pad)


def user_token_mask(prompt_ids: torch.Tensor, cfg: OmniConfig) -> torch.Tensor:
    """Bool ``[P]``: tokens inside a user turn (``<|im_start|>user ...``), as ``transformers`` picks them."""
    pos = torch.arange(prompt_ids.shape[0], device=prompt_ids.device)
    starts = torch.where(prompt_ids == cfg.im_start_token_id, pos, torch.full_like(pos, -1))
    prev = torch.cummax(starts, dim=0).values.clamp_min(0)
    role = prompt_ids[(prev + 1).clamp_max(prompt_ids.shape[0] - 1)]
    return role == cfg.user_token_id


def assistant_start(prompt_ids: torch.Tensor, cfg: OmniConfig) -> int:
    """Index of the last ``<|im_start|>assistant`` in the prompt.

    Raises:
        ValueError: the prompt has no assistant header.
    """
    hit = (prompt_ids[:-1] == cfg.im_start_token_id) & (prompt_ids[1:] == cfg.assistant_token_id)
    idx = torch.nonzero(hit).flatten()
    if idx.numel() == 0:
        raise ValueError("prompt has no '<|im_start|>assistant' header")
    return int(idx[-1])


def talker_prefill_embeds(
    talker: Talker,
    cfg: OmniConfig,
    prompt_ids: torch.Tensor,
    prompt_embeds: torch.Tensor,
    prompt_hidden: torch.Tensor,
    first_token_embed: torch.Tensor,
    specials: TalkerTextEmbeds,
    speaker_id: int,
) -> torch.Tensor:
    """The Talker prefill, ``[U + 9, talker_hidden]`` for ``U`` user tokens.

    Args:
        prompt_ids: int64 ``[P]`` Thinker prompt ids, ending with ``<|im_start|>assistant\\n``.
        prompt_embeds: ``[P, thinker_hidden]`` Thinker input embeddings (audio rows = audio tower output).
        prompt_hidden: ``[P, thinker_hidden]`` Thinker ``hidden_states[accept_hidden_layer]`` of the prompt.
        first_token_embed: ``[thinker_hidden]`` Thinker embedding of the first generated token ``g_0``.
        specials: from :func:`special_text_embeds`.
        speaker_id: codec speaker id (``talker_config.speaker_id[name]``).
    """
    tcfg = cfg.talker
    mm = prompt_ids == cfg.thinker.audio_token_id
    user = user_token_mask(prompt_ids, cfg)
    user_rows = torch.empty(
        (prompt_ids.shape[0], tcfg.text.hidden_size), dtype=prompt_embeds.dtype, device=prompt_embeds.device
    )
    if bool((user & mm).any()):
        user_rows[user & mm] = talker.hidden_projection(prompt_hidden[user & mm])
    user_rows[user & ~mm] = talker.text_projection(prompt_embeds[user & ~mm])
    user_rows = user_rows[user]

    start = assistant_start(prompt_ids, cfg)
    header = prompt_embeds[start : start + 3]
    if header.shape[0] != 3 or start + 3 != prompt_ids.shape[0]:
        raise ValueError("prompt must end with the 3-token header '<|im_start|>assistant\\n'")
    head = talker.text_projection(torch.cat((header, first_token_embed[None]), dim=0))
    text = torch.cat((head[:3], specials.tts_pad.expand(4, -1), specials.tts_bos[None], head[3:4]), dim=0)
    codec_ids = torch.tensor(
        [
            tcfg.codec_nothink_id,
            tcfg.codec_think_bos_id,
            tcfg.codec_think_eos_id,
            speaker_id,
            tcfg.codec_pad_id,
            tcfg.codec_bos_id,
        ],
        device=talker.model.codec_embedding.weight.device,
    )
    codec = torch.cat((torch.zeros_like(text[:3]), talker.model.codec_embedding(codec_ids)), dim=0)
    return torch.cat((user_rows, text + codec), dim=0)


def trailing_text_embed(
    talker: Talker,
    token_embed: torch.Tensor | None,
    is_final: bool,
    past_end: bool,
    specials: TalkerTextEmbeds,
) -> torch.Tensor:
    """Text part of a Talker decode input, ``[talker_hidden]``.

    ``token_embed`` is the Thinker embedding of ``g_{j+1}``; ``is_final`` marks it as the Thinker's last
    token (then ``tts_eos`` is used); ``past_end`` means the Thinker's text is exhausted (``tts_pad``).
    """
    if past_end:
        return specials.tts_pad
    if is_final:
        return specials.tts_eos
    return talker.text_projection(token_embed[None])[0]
