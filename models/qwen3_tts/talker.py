"""The Qwen3-TTS talker (codec LM over codebook 0) and its code predictor (codebooks 1..G−1 of a frame).

Tensor names follow ``talker.*`` of ``Qwen3TTSForConditionalGeneration`` (qwen-tts 0.1.1):
``model.codec_embedding`` ``[3072, H]``, ``model.text_embedding`` ``[text_vocab, text_hidden]``,
``model.layers.N.*`` (Qwen3 dense layers, q/k norm), ``model.norm``, ``text_projection.linear_fc{1,2}``
(biased SiLU MLP, text width → text width → H), ``codec_head``, ``code_predictor.model.*`` (Qwen3 dense
layers; ``codec_embedding.{0..G−2}`` ``[2048, H]`` at the talker's width), ``code_predictor.lm_head.{0..G−2}``
and, when the predictor is narrower than the talker (1.7B), ``code_predictor.small_to_mtp_projection``.

The talker uses interleaved M-RoPE; a TTS prompt is text and codec tokens only, whose three position
rows are equal, where M-RoPE is exactly 1-D RoPE (:class:`~omniduplex.models.layers.RotaryEmbedding`).
"""

from __future__ import annotations

import torch
from torch import nn

from omniduplex.models.config import DecoderConfig
from omniduplex.models.layers import DecoderStack
from omniduplex.models.qwen3_omni.code_predictor import CodePredictor
from omniduplex.models.qwen3_omni.talker import CodecLM, ResizeMLP
from omniduplex.models.qwen3_tts.config import TTSConfig


class TalkerModel(DecoderStack):
    """Decoder stack + ``codec_embedding`` ``[vocab, H]`` + ``text_embedding``
    ``[text_vocab, text_hidden]``."""

    def __init__(self, cfg: DecoderConfig, text_vocab: int, text_hidden: int) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(text_vocab, text_hidden)


class Talker(CodecLM):
    """Codec LM: input embeddings ``[T, H]`` → final hidden ``[T, H]``; ``codec_head`` → codebook-0 logits.

    A decode step's input is the sum of the embeddings of all ``G`` codes of the previous frame plus
    one projected text embedding (the next text token, or ``tts_pad`` once the text is consumed).
    """

    def __init__(self, cfg: TTSConfig) -> None:
        super().__init__()
        self.cfg = cfg
        t = cfg.talker
        self.model = TalkerModel(t, cfg.text_vocab_size, cfg.text_hidden_size)
        self.text_projection = ResizeMLP(cfg.text_hidden_size, cfg.text_hidden_size, t.hidden_size)
        self.codec_head = nn.Linear(t.hidden_size, t.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.predictor, cfg.num_code_groups, t.hidden_size)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids int ``[...]`` (any device) → projected embeddings ``[..., H]`` on the model's.

        Raises ValueError for an id outside ``[0, text_vocab_size)``."""
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.text_vocab_size):
            raise ValueError(f"text token id outside [0, {self.cfg.text_vocab_size})")
        table = self.model.text_embedding
        return self.text_projection(table(ids.to(table.weight.device)))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Codebook-0 / control ids int ``[...]`` (any device) → ``[..., H]`` on the model's device."""
        table = self.model.codec_embedding
        return table(ids.to(table.weight.device))

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the embeddings of one frame's codes: int64 ``[B, G]`` → ``[B, H]`` (codebook order)."""
        parts = [self.model.codec_embedding(codes[:, 0])]
        parts += [
            emb(codes[:, g]) for g, emb in enumerate(self.code_predictor.model.codec_embedding, start=1)
        ]
        return torch.stack(parts, dim=1).sum(1)  # one reduction, as the reference sums them

    def suppressed_token_mask(self) -> torch.Tensor:
        """Bool ``[vocab]``: the 1024 control ids at the top of the vocabulary except codec EOS (the ids the
        reference's ``generate`` suppresses)."""
        v = self.cfg.talker.vocab_size
        mask = torch.zeros(v, dtype=torch.bool)
        mask[max(0, v - 1024) :] = True
        mask[self.cfg.codec_ids["eos"]] = False
        return mask
