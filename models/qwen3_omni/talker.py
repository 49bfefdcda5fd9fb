"""The Talker: Qwen3-Omni's codec LM over codebook 0 (MoE with a shared expert), its input projections,
and the code predictor that fills the residual codebooks of every frame.

Tensor names follow ``talker.*`` of ``Qwen3OmniMoeForConditionalGeneration``: ``model.codec_embedding``,
``model.layers.N.*``, ``model.norm``, ``codec_head``, ``text_projection.linear_fc{1,2}``,
``hidden_projection.linear_fc{1,2}``, ``code_predictor.*``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.config import DecoderConfig, TalkerConfig
from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.layers import DecoderStack
from omniduplex.models.qwen3_omni.code_predictor import CodePredictor


class TalkerModel(DecoderStack):
    """Decoder stack with the codebook-0 embedding ``codec_embedding`` ``[vocab, hidden]``."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


class ResizeMLP(nn.Module):
    """Two-layer SiLU MLP mapping Thinker width to Talker width (``linear_fc1``, ``linear_fc2``, biased)."""

    def __init__(self, in_dim: int, mid_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(in_dim, mid_dim, bias=True)
        self.linear_fc2 = nn.Linear(mid_dim, out_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class CodecLM(nn.Module):
    """A codec LM's engine-facing half: ``model`` (a decoder stack returning ``(hidden, ...)``) and
    ``codec_head`` (hidden → codebook-0 logits), set by the subclass (Qwen3-Omni's and Qwen3-TTS's
    Talkers)."""

    model: nn.Module
    codec_head: nn.Linear

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        batch: ForwardBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """``inputs_embeds`` ``[T, hidden]`` → final normed hidden ``[T, hidden]``."""
        return self.model(inputs_embeds, batch, kv_caches)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[N, hidden]`` → codebook-0 logits ``[N, vocab]``."""
        return self.codec_head(hidden)


class Talker(CodecLM):
    """Codec LM. One step consumes an input embedding per token and predicts codebook 0 with ``codec_head``.

    The input embedding of a decode step is the sum of the embeddings of all ``num_code_groups`` codes
    of the previous frame plus one projected Thinker text embedding (``talker_prompt``).
    """

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        t = cfg.text
        self.model = TalkerModel(t)
        self.codec_head = nn.Linear(t.hidden_size, t.vocab_size, bias=False)
        self.text_projection = ResizeMLP(cfg.thinker_hidden_size, t.intermediate_size, t.hidden_size)
        self.hidden_projection = ResizeMLP(cfg.thinker_hidden_size, t.intermediate_size, t.hidden_size)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.num_code_groups)
        if cfg.code_predictor.hidden_size != t.hidden_size:
            raise ValueError(
                f"code predictor hidden_size {cfg.code_predictor.hidden_size} != talker hidden_size "
                f"{t.hidden_size}"
            )

    def suppressed_token_mask(self) -> torch.Tensor:
        """Bool ``[vocab]``: the 1024 control ids at the top of the vocabulary except codec EOS.

        ``transformers``' ``Qwen3OmniMoeForConditionalGeneration.generate`` suppresses the same ids.
        """
        v = self.cfg.text.vocab_size
        mask = torch.zeros(v, dtype=torch.bool)
        mask[max(0, v - 1024) :] = True
        mask[self.cfg.codec_eos_token_id] = False
        return mask

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the embeddings of one frame's codes: ``codes`` int64 ``[B, G]`` → ``[B, hidden]``."""
        x = self.model.codec_embedding(codes[:, 0])
        for g, emb in enumerate(self.code_predictor.model.codec_embedding, start=1):
            x = x + emb(codes[:, g])
        return x
