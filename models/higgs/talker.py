"""The Higgs Audio v3 talker: a Qwen3 decoder over text rows and fused multi-codebook audio rows.

Published tensor names (``bosonai/higgs-audio-v3-tts-4b``; the mapping sglang-omni's ``DiscreteWeightMapper``
applies): ``tied.embedding.text_embedding.weight`` ``[V_text, D]``, ``body.layers.{i}.*`` (Qwen3 layers:
``self_attn.{q,k,v,o}_proj``, ``q_norm``, ``k_norm``, ``mlp.{gate,up,down}_proj``, the two norms),
``body.norm.weight``, ``tied.embedding.modality_embeddings.0.embedding.weight`` ``[N·V, D]`` (the fused
audio embedding: codebook ``k``'s id ``c`` is row ``k·V + c``) and, when
``audio_encoder_config.tie_word_embeddings`` is false, ``tied.head.modality_heads.0.weight`` ``[N·V, D]``.
The text head (``tied.head.text_head.*``) and the bundled codec (``tied.embedding.modality_embeddings.0.
model.*``) are not used for speech and are skipped by the loader.

Math (``transformers``' ``HiggsAudioV2Model``, less its v2-only dual FFN: v3 has plain Qwen3 layers):

- an audio row's input is the SUM over codebooks of its codes' embeddings, ids offset by ``k·V``
  (``HiggsAudioV2Embeddings``: ``embed(ids + offsets).sum(-2)``);
- the head maps the last hidden state to ``[N·V]`` logits, read as ``[N, V]`` (one distribution per
  codebook, ``HiggsAudioV2ForConditionalGeneration.audio_lm_head``); tied, it is ``h · Eᵀ``.
"""

from __future__ import annotations

import torch
from torch import nn

from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.higgs.config import HiggsConfig
from omniduplex.models.layers import DecoderStack


class FusedCodebookEmbedding(nn.Module):
    """One ``[N·V, D]`` table for ``N`` codebooks of ``V`` ids (``embedding.weight``)."""

    def __init__(self, num_codebooks: int, vocab: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_codebooks * vocab, dim)
        self.register_buffer("offsets", torch.arange(num_codebooks) * vocab, persistent=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes int64 ``[..., N]`` (each in ``[0, V)``) → ``[..., D]``, the sum of their embeddings."""
        return self.embedding(codes + self.offsets).sum(dim=-2)


class _Embeddings(nn.Module):
    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        d = cfg.text.hidden_size
        self.text_embedding = nn.Embedding(cfg.text.vocab_size, d)
        self.modality_embeddings = nn.ModuleList(
            [FusedCodebookEmbedding(cfg.num_codebooks, cfg.vocab_size, d)]
        )


class _Heads(nn.Module):
    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        d, rows = cfg.text.hidden_size, cfg.num_codebooks * cfg.vocab_size
        self.modality_heads = nn.ModuleList([nn.Linear(d, rows, bias=False)])


class _Tied(nn.Module):
    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.embedding = _Embeddings(cfg)
        self.head = _Heads(cfg)


class HiggsTalker(nn.Module):
    """Backbone + fused audio embedding + fused audio head (module docstring). No scheduling, no codec."""

    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.body = DecoderStack(cfg.text)
        self.tied = _Tied(cfg)
        if cfg.tie_audio_embeddings:  # audio_encoder_config.tie_word_embeddings
            self.tied.head.modality_heads[0].weight = self.audio_embedding.embedding.weight

    @property
    def audio_embedding(self) -> FusedCodebookEmbedding:
        return self.tied.embedding.modality_embeddings[0]

    @property
    def text_embedding(self) -> nn.Embedding:
        return self.tied.embedding.text_embedding

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Audio rows: codes int64 ``[T, N]`` in ``[0, V)`` → ``[T, D]``."""
        return self.audio_embedding(codes)

    def embed_rows(self, ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Mixed prompt rows → ``[T, D]``: row ``t`` is text id ``ids[t]`` when ``ids[t] >= 0``, else the
        audio frame ``codes[t]`` (int64 ``[T]`` and ``[T, N]``; a row's unused half is ignored)."""
        audio = ids < 0
        out = self.text_embedding(ids.clamp(min=0))
        if bool(audio.any()):
            rows = audio.nonzero().flatten()
            out[rows] = self.embed_codes(codes[rows]).to(out.dtype)
        return out

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        """``[T, D]`` input rows → final hidden states ``[T, D]`` (paged KV written)."""
        return self.body(x, batch, kv)[0]

    def codebook_logits(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, D]`` → fp32 ``[B, N, V]``."""
        logits = self.tied.head.modality_heads[0](h)
        return logits.float().view(h.shape[0], self.cfg.num_codebooks, self.cfg.vocab_size)
