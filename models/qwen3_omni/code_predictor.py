"""Qwen3-Omni's code predictor (multi-token prediction of the residual codebooks), batched over frames.

For each frame it sees ``[talker hidden, embed(code 0)]`` and generates codes ``1..G-1``
autoregressively: step ``g`` reads ``lm_head[g-1]`` and feeds ``codec_embedding[g-1](code g)`` next.
All frames of an engine step run together in one short sequence per frame on a scratch KV cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from omniduplex.models.config import DecoderConfig
from omniduplex.models.forward_batch import BLOCK_SIZE, ForwardBatch, allocate_kv_cache
from omniduplex.models.layers import DecoderStack

SampleFn = Callable[[torch.Tensor, int], torch.Tensor]
"""``(logits [B, vocab] fp32, codebook index g) -> codes [B] int64``."""


def greedy(logits: torch.Tensor, _g: int) -> torch.Tensor:
    """Argmax sampling for the code predictor."""
    return logits.argmax(dim=-1)


class CodePredictorModel(DecoderStack):
    """Dense decoder with one input embedding per residual codebook (``codec_embedding.{0..G-2}``,
    ``[vocab, embed_dim]``; ``embed_dim`` is the predictor's width unless given)."""

    def __init__(self, cfg: DecoderConfig, num_code_groups: int, embed_dim: int | None = None) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embed_dim or cfg.hidden_size) for _ in range(num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Fills codebooks ``1..G-1`` of a frame from the Talker's hidden state and codebook-0 id.

    ``talker_hidden`` (Qwen3-TTS): the talker's width, when it differs from the predictor's; every input
    then goes through ``small_to_mtp_projection`` (``[talker_hidden] → [hidden]``, biased) first, and the
    codebook embeddings are at the talker's width (qwen-tts 0.1.1 ``Qwen3TTSTalkerCodePredictor``).
    """

    def __init__(self, cfg: DecoderConfig, num_code_groups: int, talker_hidden: int | None = None) -> None:
        super().__init__()
        self.cfg, self.num_code_groups = cfg, num_code_groups
        self.model = CodePredictorModel(cfg, num_code_groups, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(num_code_groups - 1)
        )
        narrower = talker_hidden is not None and talker_hidden != cfg.hidden_size
        self.small_to_mtp_projection = nn.Linear(talker_hidden, cfg.hidden_size) if narrower else None

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.small_to_mtp_projection is None else self.small_to_mtp_projection(x)

    @torch.no_grad()
    def predict(
        self,
        talker_hidden: torch.Tensor,
        code0: torch.Tensor,
        code0_embed: torch.Tensor,
        sample: SampleFn = greedy,
    ) -> torch.Tensor:
        """Generate the residual codes of ``B`` frames at once.

        Args:
            talker_hidden: ``[B, hidden]`` Talker final hidden state that produced ``code0``.
            code0: int64 ``[B]`` codebook-0 ids.
            code0_embed: ``[B, hidden]`` Talker ``codec_embedding(code0)``.
            sample: picks one code per frame from fp32 logits ``[B, vocab]``.

        Returns:
            int64 ``[B, G]``: the full frame, ``code0`` first.
        """
        b, g_total = code0.shape[0], self.num_code_groups
        if b == 0:
            return code0.new_zeros((0, g_total))
        nblk = -(-(g_total + 1) // BLOCK_SIZE)
        kv = allocate_kv_cache(
            self.cfg.num_hidden_layers,
            b * nblk,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
            dtype=talker_hidden.dtype,
            device=talker_hidden.device,
        )
        codes = [code0]
        x = self._project(torch.stack((talker_hidden, code0_embed), dim=1).reshape(2 * b, -1))
        for g in range(1, g_total):
            q_len, ctx = (2, 0) if g == 1 else (1, g)
            batch = ForwardBatch.contiguous([q_len] * b, [ctx] * b, device=x.device)
            # every frame owns nblk blocks even when fewer are used, so block ids stay fixed across steps
            batch.block_tables = torch.arange(b * nblk, dtype=torch.int32, device=x.device).view(b, nblk)
            pos = batch.positions.view(b, q_len)
            batch.slot_mapping = (batch.block_tables[:, :1].long() * BLOCK_SIZE + pos).reshape(-1)
            hidden, _ = self.model(x, batch, kv)
            last = hidden.view(b, q_len, -1)[:, -1]
            logits = self.lm_head[g - 1](last).float()
            code = sample(logits, g)
            codes.append(code)
            x = self._project(self.model.codec_embedding[g - 1](code))
        return torch.stack(codes, dim=1)
