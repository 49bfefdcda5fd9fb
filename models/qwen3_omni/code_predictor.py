"""Qwen3-Omni's code predictor (multi-token prediction of the residual codebooks), batched over frames.

For each frame it sees ``[talker hidden, embed(code 0)]`` and generates codes ``1..G-1``
autoregressively: step ``g`` reads ``lm_head[g-1]`` and feeds ``codec_embedding[g-1](code g)`` next.
All frames of an engine step run together in one short sequence per frame on a scratch KV cache, in a
lean loop over the layers (:meth:`CodePredictor._step`): 15 sequential steps of a few rows per frame,
where per-op overhead, not arithmetic, is most of the time on CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.config import DecoderConfig
from omniduplex.models.layers import DecoderStack, RMSNorm, apply_rotary

SampleFn = Callable[[torch.Tensor, int], torch.Tensor]
"""``(logits [B, vocab] fp32, codebook index g) -> codes [B] int64``."""


def _norm(m: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``m(x)`` as one fused op (the same numbers in fp32, measured bit-equal; ~half the time of the
    module's six ops on a predictor row)."""
    return F.rms_norm(x, m.weight.shape, m.weight, m.eps) if x.dtype == torch.float32 else m(x)


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

    def _step(self, x: torch.Tensor, pos: int, cos, sin, kv: list) -> torch.Tensor:
        """Rows ``x`` ``[B, t, hidden]`` at positions ``pos..pos+t−1`` of every frame's own short sequence
        → final hidden ``[B, t, hidden]``. The frames' K/V (``[B, kv_heads, ≤ G, head_dim]`` per layer) grow
        in ``kv``. The model's layers and weights, in a lean loop: no paged cache or flat batch for a
        sequence of at most ``G`` rows (15 steps per frame, where per-op overhead is most of the time)."""
        b, t, _ = x.shape
        for i, layer in enumerate(self.model.layers):
            a = layer.self_attn
            qkv = a.qkv_proj(_norm(layer.input_layernorm, x))
            q, k, v = qkv.split((a.q_size, a.kv_size, a.kv_size), dim=-1)
            q = q.reshape(b, t, a.num_heads, a.head_dim)
            k = k.reshape(b, t, a.num_kv_heads, a.head_dim)
            if a.q_norm is not None:
                q, k = _norm(a.q_norm, q), _norm(a.k_norm, k)
            q, k = apply_rotary(q, cos, sin).transpose(1, 2), apply_rotary(k, cos, sin).transpose(1, 2)
            v = v.reshape(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)
            if kv[i] is not None:
                k, v = torch.cat((kv[i][0], k), dim=2), torch.cat((kv[i][1], v), dim=2)
            kv[i] = (k, v)
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=t > 1, scale=a.scale, enable_gqa=a.num_heads != a.num_kv_heads
            )
            x = x + a.o_proj(out.transpose(1, 2).reshape(b, t, -1))
            x = x + layer.mlp(_norm(layer.post_attention_layernorm, x))
        return _norm(self.model.norm, x)

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
        codes = [code0]
        x = self._project(torch.stack((talker_hidden, code0_embed), dim=1))  # [B, 2, hidden]
        cos, sin = self.model.rotary(torch.arange(g_total, device=x.device))  # positions 0..G−1
        kv = [None] * len(self.model.layers)
        for g in range(1, g_total):
            pos = 0 if g == 1 else g
            hidden = self._step(x, pos, cos[pos : pos + x.shape[1]], sin[pos : pos + x.shape[1]], kv)
            logits = self.lm_head[g - 1](hidden[:, -1]).float()
            code = sample(logits, g)
            codes.append(code)
            x = self._project(self.model.codec_embedding[g - 1](code))[:, None]
        return torch.stack(codes, dim=1)
