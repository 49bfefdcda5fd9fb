"""A decoder-only LM on our layers: Qwen3-Omni's Thinker (MoE decoder + audio tower), or a plain text LM
(Qwen3 / Qwen3-MoE, Qwen2, Llama: the cascade's SmolLM2 too).

Tensor names follow ``thinker.*`` of ``Qwen3OmniMoeForConditionalGeneration`` (``audio_tower.*``,
``model.embed_tokens``, ``model.layers.N.*``, ``model.norm``, ``lm_head``); a ``Qwen3ForCausalLM`` /
``Qwen3MoeForCausalLM`` checkpoint has the same names without the prefix and without an audio tower.
"""

from __future__ import annotations

import torch
from torch import nn

from omniduplex.models.config import DecoderConfig
from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.layers import DecoderStack


class DecoderLMTextModel(DecoderStack):
    """Decoder stack with its token embedding ``embed_tokens`` ``[vocab, hidden]``."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


class DecoderLM(nn.Module):
    """Text LLM over a flat token batch; audio embeddings replace the ``<|audio_pad|>`` token rows.

    Args:
        text_cfg: decoder config (``thinker_config.text_config`` or a Qwen3 config).
        audio_tower: the audio encoder module, or ``None`` for a text-only checkpoint.
        audio_token_id: id of ``<|audio_pad|>`` (151646 in the published vocabulary).
    """

    def __init__(
        self, text_cfg: DecoderConfig, audio_tower: nn.Module | None = None, audio_token_id: int | None = None
    ) -> None:
        super().__init__()
        self.cfg = text_cfg
        self.audio_tower = audio_tower
        self.audio_token_id = audio_token_id
        self.model = DecoderLMTextModel(text_cfg)
        self.lm_head = nn.Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False)
        if text_cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, input_ids: torch.Tensor, audio_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids`` int64 ``[T]`` → ``[T, hidden]``; rows of ``<|audio_pad|>`` take ``audio_embeds``.

        Raises:
            ValueError: the number of ``<|audio_pad|>`` tokens differs from ``audio_embeds`` rows.
        """
        x = self.model.embed_tokens(input_ids)
        n_audio = 0 if audio_embeds is None else audio_embeds.shape[0]
        if self.audio_token_id is None:
            if n_audio:
                raise ValueError("this checkpoint has no audio tower; audio embeddings were given")
            return x
        mask = input_ids == self.audio_token_id
        n_pad = int(mask.sum())
        if n_pad != n_audio:
            raise ValueError(
                f"prompt has {n_pad} <|audio_pad|> tokens but {n_audio} audio embeddings were given"
            )
        if n_audio:
            x = x.masked_scatter(mask[:, None], audio_embeds.to(x.dtype))
        return x

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        batch: ForwardBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        capture_layer: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``inputs_embeds`` ``[T, hidden]`` → ``(final hidden [T, hidden], hidden_states[capture])``."""
        return self.model(inputs_embeds, batch, kv_caches, capture_layer)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[N, hidden]`` → logits ``[N, vocab]`` (dtype of the weights)."""
        return self.lm_head(hidden)
