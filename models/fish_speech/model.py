"""Fish Speech S2 Pro's Dual-AR language model: the slow AR over the semantic codebook and the fast AR over a
frame's residual codebooks (Fish Audio, "Fish Audio S2 technical report", arXiv:2603.08823).

Math (``fish_speech/models/text2semantic/llama.py``, ``DualARTransformer``):

- Slow AR: a Qwen3 decoder (pre-norm blocks, GQA, q/k RMSNorm when ``attention_qk_norm``, SwiGLU). Input
  row of a token ``t`` with codes ``c_0..c_{N−1}``: ``embeddings(t)``; when ``t`` is a semantic token, plus
  ``Σ_i codebook_embeddings(c_i + i · codebook_size)``, the sum divided by ``√(N + 1)``
  (``scale_codebook_embeddings``). Output: the final RMSNorm, then the token logits (tied to ``embeddings``
  unless ``tie_word_embeddings`` is false), of which only the semantic tokens and ``<|im_end|>`` may be
  sampled (the reference's ``semantic_logit_bias``): :meth:`FishLM.compute_logits` computes just those
  ``codebook_size + 1`` rows (index ``codebook_size`` is ``<|im_end|>``).
- Fast AR: a short decoder over ``[proj(h), fast_emb(c_0), …, fast_emb(c_{N−2})]`` at positions ``0..N−1``,
  ``h`` the slow AR's normed final hidden state (``norm_fastlayer_input``), ``proj`` = ``fast_project_in``
  when the widths differ; position ``g`` predicts ``c_g`` through ``norm`` and ``output``. One embedding
  table and one head for every codebook: :class:`~omniduplex.models.qwen3_omni.code_predictor.CodePredictor`
  with ``shared_tables`` and only the hidden state projected.
- RoPE: interleaved pairs (GPT-J / complex form) with the ``cos``/``sin`` table stored in bf16. Our layers
  rotate halves; the loader permutes each head's q/k rows (and the q/k norm weights) from pair order
  ``(0, 1), (2, 3), …`` to half order ``(0, D/2), (1, D/2+1), …``, which leaves every q·k product unchanged,
  and the rotary tables are rounded to bf16 (:class:`~omniduplex.models.layers.RotaryEmbedding`
  ``table_dtype``).

Published tensor names (``model.safetensors``): ``text_model.model.{embeddings, norm, output}.weight``,
``text_model.model.layers.{i}.{attention.{wqkv, wo, q_norm, k_norm}, attention_norm, ffn_norm,
feed_forward.{w1, w2, w3}}.*``, ``audio_decoder.codebook_embeddings.weight`` (the slow AR's codebook table),
``audio_decoder.{embeddings, output, norm}.weight``, ``audio_decoder.fast_project_in.{weight, bias}``,
``audio_decoder.layers.{i}.*`` (as the slow AR's layers).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omniduplex.models.checkpoint import CheckpointError, iter_tensors
from omniduplex.models.config import DecoderConfig
from omniduplex.models.fish_speech.config import FishConfig
from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.layers import DecoderStack, RotaryEmbedding
from omniduplex.models.qwen3_omni.code_predictor import CodePredictor

SLOW, FAST = "text_model.model.", "audio_decoder."
_LAYER_NAMES = {  # ours (under layers.{i}.) → published (under layers.{i}.)
    "self_attn.qkv_proj.weight": "attention.wqkv.weight",
    "self_attn.qkv_proj.bias": "attention.wqkv.bias",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "self_attn.o_proj.bias": "attention.wo.bias",
    "self_attn.q_norm.weight": "attention.q_norm.weight",
    "self_attn.k_norm.weight": "attention.k_norm.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.gate_up_proj.weight": ("feed_forward.w1.weight", "feed_forward.w3.weight"),
}
_TOP_NAMES = {
    "model.embeddings.weight": SLOW + "embeddings.weight",
    "model.norm.weight": SLOW + "norm.weight",
    "output.weight": SLOW + "output.weight",
    "model.codebook_embeddings.weight": FAST + "codebook_embeddings.weight",
    "code_predictor.model.codec_embedding.0.weight": FAST + "embeddings.weight",
    "code_predictor.lm_head.0.weight": FAST + "output.weight",
    "code_predictor.model.norm.weight": FAST + "norm.weight",
    "code_predictor.small_to_mtp_projection.weight": FAST + "fast_project_in.weight",
    "code_predictor.small_to_mtp_projection.bias": FAST + "fast_project_in.bias",
}


class SlowARModel(DecoderStack):
    """The slow AR's decoder with its token table ``embeddings`` ``[vocab, dim]`` and the codebook table
    ``codebook_embeddings`` ``[N · codebook_size, dim]``; rotary table in bf16 (module docstring)."""

    def __init__(self, cfg: DecoderConfig, codebook_rows: int) -> None:
        super().__init__(cfg)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, table_dtype=torch.bfloat16)
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.codebook_embeddings = nn.Embedding(codebook_rows, cfg.hidden_size)


class FishLM(nn.Module):
    """Slow AR + fast AR (``code_predictor``) of one checkpoint, with the interface of the engine's talker
    adapter (:class:`~omniduplex.pipeline.engine.adapters.TalkerAdapter`): ``forward``, ``compute_logits``
    over the ``codebook_size + 1`` samplable ids, ``frame_embedding``, ``code0_embedding``."""

    def __init__(self, cfg: FishConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n, size = cfg.num_codebooks, cfg.codebook_size
        self.model = SlowARModel(cfg.slow, n * size)
        tied = cfg.slow.tie_word_embeddings
        self.output = None if tied else nn.Linear(cfg.slow.hidden_size, cfg.slow.vocab_size, bias=False)
        self.code_predictor = CodePredictor(
            cfg.fast, n, talker_hidden=cfg.slow.hidden_size, shared_tables=True, project_codes=False
        )
        f = cfg.fast
        self.code_predictor.model.rotary = RotaryEmbedding(
            f.head_dim, f.rope_theta, table_dtype=torch.bfloat16
        )
        self.register_buffer("codebook_offsets", torch.arange(n) * size, persistent=False)
        self._head: tuple[int, torch.Tensor] | None = None

    def forward(self, inputs_embeds: torch.Tensor, batch: ForwardBatch, kv_caches) -> torch.Tensor:
        """Input rows ``[T, dim]`` → the slow AR's normed final hidden ``[T, dim]`` (the fast AR's input)."""
        return self.model(inputs_embeds, batch, kv_caches)[0]

    def _head_weight(self) -> torch.Tensor:
        """Rows of the output head for the semantic tokens, then ``<|im_end|>``: ``[codebook_size + 1, dim]``
        (built once per weight version)."""
        w = self.model.embeddings.weight if self.output is None else self.output.weight
        key = (w.data_ptr(), w._version)
        if self._head is None or self._head[0] != key:
            c = self.cfg
            rows = torch.cat(
                (w[c.semantic_begin_id : c.semantic_end_id + 1], w[c.im_end_id : c.im_end_id + 1])
            )
            self._head = (key, rows.contiguous())
        return self._head[1]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, dim]`` → logits ``[B, codebook_size + 1]``: code ``k`` of codebook 0 (token
        ``semantic_begin_id + k``) at index ``k``, ``<|im_end|>`` at index ``codebook_size``."""
        return F.linear(hidden, self._head_weight())

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, dim]`` → logits over the whole text vocabulary ``[B, vocab]`` (unconstrained)."""
        w = self.model.embeddings.weight if self.output is None else self.output.weight
        return F.linear(hidden, w)

    def suppressed_token_mask(self) -> torch.Tensor:
        """Bool ``[codebook_size + 1]``: nothing beyond the constraint :meth:`compute_logits` applies."""
        return torch.zeros(self.cfg.codebook_size + 1, dtype=torch.bool)

    def code0_embedding(self, code0: torch.Tensor) -> torch.Tensor:
        """Codebook-0 ids ``[B]`` → the fast AR's embedding of them ``[B, fast_dim]`` (position-1 input)."""
        return self.code_predictor.model.codec_embedding[0](code0)

    def input_rows(self, ids: torch.Tensor, codes: torch.Tensor | None = None) -> torch.Tensor:
        """Slow-AR input rows ``[T, dim]`` of tokens ``ids`` int64 ``[T]`` and their codes int64 ``[T, N]``
        (read at semantic tokens only; ``None``: no semantic token carries codes, as in plain text).

        Raises:
            ValueError: an id outside the vocabulary, a semantic token without codes, or a code outside
                ``[0, codebook_size)``.
        """
        c = self.cfg
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= c.slow.vocab_size):
            raise ValueError(f"token id outside the vocabulary [0, {c.slow.vocab_size})")
        x = self.model.embeddings(ids)
        semantic = (ids >= c.semantic_begin_id) & (ids <= c.semantic_end_id)
        if not bool(semantic.any()):
            return x
        if codes is None or codes.shape != (ids.shape[0], c.num_codebooks):
            raise ValueError(f"semantic tokens need their codes as [T, {c.num_codebooks}]")
        sel = semantic.nonzero().squeeze(1)
        x = x.clone()
        x[sel] = self._with_codes(x[sel], codes[sel])
        return x

    def _with_codes(self, token_rows: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= c.codebook_size):
            raise ValueError(f"codes must lie in [0, {c.codebook_size})")
        vq = self.model.codebook_embeddings(codes + self.codebook_offsets).sum(dim=1)
        return (token_rows + vq) / math.sqrt(c.num_codebooks + 1)

    def frame_embedding(self, frames: torch.Tensor) -> torch.Tensor:
        """The next slow-AR input row of each frame: ``frames`` int64 ``[B, N]`` (its semantic token is
        ``semantic_begin_id + frames[:, 0]``) → ``[B, dim]``."""
        return self._with_codes(self.model.embeddings(frames[:, 0] + self.cfg.semantic_begin_id), frames)


# -------------------------------------------------------------------------------- published tensor layout


def _pair_to_half(rows: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's ``head_dim`` rows (dim 0) from interleaved pairs to rotate-half order."""
    perm = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    return rows.reshape(heads, head_dim, *rows.shape[1:])[:, perm].reshape(rows.shape)


def _qkv_to_half(t: torch.Tensor, cfg: DecoderConfig) -> torch.Tensor:
    q_rows, kv_rows = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    q, k, v = t.split((q_rows, kv_rows, kv_rows))
    return torch.cat(
        (
            _pair_to_half(q, cfg.num_attention_heads, cfg.head_dim),
            _pair_to_half(k, cfg.num_key_value_heads, cfg.head_dim),
            v,
        )
    )


def _sources(lm: FishLM) -> Iterator[tuple[str, tuple[str, ...], object]]:
    """``(our name, published names, transform)`` of every tensor of ``lm``'s state dict; ``transform``
    maps the published tensor (the parts concatenated along dim 0) to ours, or ``None`` for as stored."""
    for name in lm.state_dict():
        if name in _TOP_NAMES:
            yield name, (_TOP_NAMES[name],), None
            continue
        for ours, published, cfg in (
            ("model.layers.", SLOW + "layers.", lm.cfg.slow),
            ("code_predictor.model.layers.", FAST + "layers.", lm.cfg.fast),
        ):
            if name.startswith(ours):
                idx, leaf = name[len(ours) :].split(".", 1)
                parts = _LAYER_NAMES[leaf]
                parts = (parts,) if isinstance(parts, str) else parts
                if leaf.startswith("self_attn.qkv_proj"):
                    fn = lambda t, c=cfg: _qkv_to_half(t, c)  # noqa: E731
                elif leaf.startswith(("self_attn.q_norm", "self_attn.k_norm")):
                    fn = lambda t, c=cfg: _pair_to_half(t, 1, c.head_dim)  # noqa: E731
                else:
                    fn = None
                yield name, tuple(f"{published}{idx}.{p}" for p in parts), fn
                break
        else:
            raise AssertionError(f"no published name for {name}")  # a module added without its mapping


def published_shapes(lm: FishLM) -> dict[str, tuple[int, ...]]:
    """Published tensor name → shape of every tensor of ``lm`` (the checkpoint a preset writes)."""
    shapes = {}
    ours = lm.state_dict()
    for name, parts, _ in _sources(lm):
        t = ours[name]
        rows = t.shape[0] // len(parts)
        shapes.update({p: (rows, *t.shape[1:]) for p in parts})
    return shapes


def load_fish_lm(lm: FishLM, files: dict[str, Path]) -> None:
    """Fill ``lm`` from checkpoint tensors in the published layout (module docstring), strictly.

    Raises:
        CheckpointError: a tensor is missing (the message names it and its expected shape) or mis-shaped, or
            the checkpoint holds a ``text_model.`` / ``audio_decoder.`` tensor the config does not describe.
    """
    ours = lm.state_dict()
    expected = published_shapes(lm)
    unexpected = sorted(n for n in files if n.startswith((SLOW, FAST)) and n not in expected)
    if unexpected:
        raise CheckpointError(
            f"checkpoint tensor '{unexpected[0]}' is not part of the model the config describes "
            f"({len(unexpected)} such tensors) — config and weights disagree"
        )
    missing = [n for n in expected if n not in files]
    if missing:
        raise CheckpointError(f"missing tensor '{missing[0]}' (expected shape {list(expected[missing[0]])})")
    for name, parts, fn in _sources(lm):
        tensors = dict(iter_tensors(files, list(parts)))
        for p in parts:
            if tuple(tensors[p].shape) != expected[p]:
                raise CheckpointError(
                    f"tensor '{p}' in {files[p].name} has shape {list(tensors[p].shape)}, the config implies "
                    f"{list(expected[p])}"
                )
        t = torch.cat([tensors[p] for p in parts]) if len(parts) > 1 else tensors[parts[0]]
        with torch.no_grad():
            ours[name].copy_((fn(t) if fn else t).to(ours[name].dtype))
