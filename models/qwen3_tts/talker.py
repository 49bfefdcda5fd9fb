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

from collections.abc import Callable

import torch
from torch import nn

from omniduplex.models.config import DecoderConfig
from omniduplex.models.forward_batch import BLOCK_SIZE, ForwardBatch, allocate_kv_cache
from omniduplex.models.layers import DecoderStack
from omniduplex.models.qwen3_omni.talker import ResizeMLP
from omniduplex.models.qwen3_tts.config import TTSConfig

SampleFn = Callable[[torch.Tensor, int], torch.Tensor]
"""``(logits [B, vocab] fp32, codebook index g) -> codes [B] int64``."""


def greedy(logits: torch.Tensor, _g: int) -> torch.Tensor:
    """Argmax (the reference with ``subtalker_dosample=False``)."""
    return logits.argmax(dim=-1)


class TalkerModel(DecoderStack):
    """Decoder stack + ``codec_embedding`` ``[vocab, H]`` + ``text_embedding``
    ``[text_vocab, text_hidden]``."""

    def __init__(self, cfg: DecoderConfig, text_vocab: int, text_hidden: int) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(text_vocab, text_hidden)


class CodePredictorModel(DecoderStack):
    """Dense decoder with one input embedding (at the talker's width) per residual codebook."""

    def __init__(self, cfg: DecoderConfig, num_code_groups: int, embed_dim: int) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embed_dim) for _ in range(num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Fills codebooks ``1..G−1`` of a frame from the talker's last hidden state and the codebook-0 id.

    Per frame, the input sequence is ``[talker hidden, talker codec_embedding(code 0)]``; step ``g`` reads
    ``lm_head[g−1]`` and feeds ``codec_embedding[g−1](code g)`` next; every input goes through
    ``small_to_mtp_projection`` first (identity when the widths match).
    """

    def __init__(self, cfg: DecoderConfig, num_code_groups: int, talker_hidden: int) -> None:
        super().__init__()
        self.cfg, self.num_code_groups = cfg, num_code_groups
        self.model = CodePredictorModel(cfg, num_code_groups, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(num_code_groups - 1)
        )
        self.small_to_mtp_projection = (
            nn.Linear(talker_hidden, cfg.hidden_size, bias=True) if talker_hidden != cfg.hidden_size else None
        )

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
        """Residual codes of ``B`` frames at once, each frame on its own scratch KV cache (the signature of
        Qwen3-Omni's code predictor, so the engine's ``TalkerAdapter`` drives either).

        Args:
            talker_hidden: ``[B, H]`` talker final hidden state that produced ``code0``.
            code0: int64 ``[B]``.
            code0_embed: ``[B, H]`` talker ``codec_embedding(code0)``.
            sample: picks one code per frame from fp32 logits ``[B, vocab]``.

        Returns:
            int64 ``[B, G]``: the full frame, ``code0`` first.
        """
        b, groups = code0.shape[0], self.num_code_groups
        if b == 0:
            return code0.new_zeros((0, groups))
        nblk = -(-(groups + 1) // BLOCK_SIZE)
        kv = allocate_kv_cache(
            self.cfg.num_hidden_layers,
            b * nblk,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
            dtype=talker_hidden.dtype,
            device=talker_hidden.device,
        )
        tables = torch.arange(b * nblk, dtype=torch.int32, device=code0.device).view(b, nblk)
        codes = [code0]
        x = self._project(torch.stack((talker_hidden, code0_embed), dim=1).reshape(2 * b, -1))
        for g in range(1, groups):
            q_len, ctx = (2, 0) if g == 1 else (1, g)
            batch = ForwardBatch.contiguous([q_len] * b, [ctx] * b, device=x.device)
            batch.block_tables = tables
            pos = batch.positions.view(b, q_len)
            batch.slot_mapping = (tables[:, :1].long() * BLOCK_SIZE + pos).reshape(-1)
            hidden, _ = self.model(x, batch, kv)
            code = sample(self.lm_head[g - 1](hidden.view(b, q_len, -1)[:, -1]).float(), g)
            codes.append(code)
            x = self._project(self.model.codec_embedding[g - 1](code))
        return torch.stack(codes, dim=1)


class Talker(nn.Module):
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

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        batch: ForwardBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        return self.model(inputs_embeds, batch, kv_caches)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` → codebook-0 logits ``[N, vocab]``."""
        return self.codec_head(hidden)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids int ``[...]`` → projected embeddings ``[..., H]``.

        Raises ValueError for an id outside ``[0, text_vocab_size)``."""
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.text_vocab_size):
            raise ValueError(f"text token id outside [0, {self.cfg.text_vocab_size})")
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Codebook-0 / control ids int ``[...]`` → ``[..., H]``."""
        return self.model.codec_embedding(ids)

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
