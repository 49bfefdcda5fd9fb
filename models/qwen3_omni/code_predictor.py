"""The code predictor (multi-token prediction of a frame's residual codebooks), batched over frames:
Qwen3-Omni's and Qwen3-TTS's code predictor and Fish Speech's fast AR are the same shape.

For each frame it sees ``[talker hidden, embed(code 0)]`` and generates codes ``1..G-1`` autoregressively:
step ``g`` reads the output head of codebook ``g`` and feeds the embedding of code ``g`` next. All frames of
an engine step run together in one short sequence per frame, in a lean loop over the layers
(:meth:`CodePredictor._step`): G-1 sequential steps of a few rows per frame, where per-op overhead, not
arithmetic, is most of the time on CPU.

Config switches (the families differ only in these):

- ``shared_tables``: one embedding table and one output head for every codebook (Fish Speech's fast AR:
  ``embeddings``, ``output``) instead of one per residual codebook (Qwen3-Omni / Qwen3-TTS).
- ``talker_hidden`` with ``project_codes``: the talker's width when it differs from the predictor's; its
  hidden state goes through ``small_to_mtp_projection`` (biased) first. ``project_codes`` (Qwen3-TTS): the
  code embeddings are at the talker's width and are projected too; without it (Fish Speech's
  ``fast_project_in``) they are at the predictor's width and only the hidden state is projected.

``static_buffers`` (the fast-AR buffer lever): the inputs of a frame batch (one row per position: the
projected hidden state, then each code's embedding, written in place), the rotary table of positions
``0..G-1`` and each layer's K/V live in a :class:`PredictorWorkspace` allocated once for up to ``capacity``
frames and reused every engine step (grown only when a step has more frames), instead of being stacked,
recomputed and concatenated per frame batch. Same values either way.
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
    """Dense decoder with ``num_tables`` input embeddings (``codec_embedding.{i}``, ``[vocab, embed_dim]``;
    ``embed_dim`` is the predictor's width unless given)."""

    def __init__(self, cfg: DecoderConfig, num_tables: int, embed_dim: int | None = None) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embed_dim or cfg.hidden_size) for _ in range(num_tables)
        )


class PredictorWorkspace:
    """The fast-AR buffers of up to ``capacity`` frames, allocated once and reused by every frame batch.

    Attributes:
        rows: ``[G, capacity, hidden]`` inputs by position: row 0 the projected talker hidden state, row
            ``g`` the embedding of code ``g − 1`` (written in place by the embedding lookup).
        positions: int64 ``[G]``, ``0..G−1``; ``cos``, ``sin``: fp32 ``[G, head_dim]``, their rotary table.
        k, v: ``[layers, capacity, kv_heads, G, head_dim]`` per-layer K/V of the frames' short sequences.
        allocations: times the buffers were (re)allocated (1 unless a step outgrew ``capacity``).
    """

    def __init__(self, predictor: CodePredictor, capacity: int, dtype: torch.dtype, device) -> None:
        cfg, g = predictor.cfg, predictor.num_code_groups
        self.capacity = capacity
        self.rows = torch.empty((g, capacity, cfg.hidden_size), dtype=dtype, device=device)
        shape = (len(predictor.model.layers), capacity, cfg.num_key_value_heads, g, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.positions = torch.arange(g, device=device)
        self.cos, self.sin = predictor.model.rotary(self.positions)
        self.allocations = 1

    def fits(self, b: int, dtype: torch.dtype, device) -> bool:
        return b <= self.capacity and self.rows.dtype == dtype and self.rows.device == torch.device(device)


class CodePredictor(nn.Module):
    """Fills codebooks ``1..G-1`` of a frame from the talker's hidden state and codebook-0 id.

    Args:
        cfg: the predictor's decoder config.
        num_code_groups: ``G``, codebooks per frame (codebook 0 included).
        talker_hidden: the talker's width, when it differs from the predictor's (module docstring).
        shared_tables: one embedding table and one output head for all codebooks (module docstring).
        project_codes: code embeddings at the talker's width, projected like the hidden state.
    """

    def __init__(
        self,
        cfg: DecoderConfig,
        num_code_groups: int,
        talker_hidden: int | None = None,
        shared_tables: bool = False,
        project_codes: bool = True,
    ) -> None:
        super().__init__()
        self.cfg, self.num_code_groups = cfg, num_code_groups
        tables = 1 if shared_tables else num_code_groups - 1
        self.shared_tables, self.project_codes = shared_tables, project_codes
        self.model = CodePredictorModel(cfg, tables, talker_hidden if project_codes else None)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(tables)
        )
        narrower = talker_hidden is not None and talker_hidden != cfg.hidden_size
        self.small_to_mtp_projection = nn.Linear(talker_hidden, cfg.hidden_size) if narrower else None
        self.static_buffers = False
        """Reuse one :class:`PredictorWorkspace` across frame batches (module docstring)."""
        self.workspace: PredictorWorkspace | None = None

    def embedding(self, g: int) -> nn.Embedding:
        """The input table of codebook ``g`` (``1 <= g < G``; with ``shared_tables`` also code 0's)."""
        return self.model.codec_embedding[0 if self.shared_tables else g - 1]

    def head(self, g: int) -> nn.Linear:
        """The output head that predicts codebook ``g`` (``1 <= g < G``)."""
        return self.lm_head[0 if self.shared_tables else g - 1]

    def _step(self, x: torch.Tensor, pos: int, cos, sin, kv) -> torch.Tensor:
        """Rows ``x`` ``[B, t, hidden]`` at positions ``pos..pos+t−1`` of every frame's own short sequence
        → final hidden ``[B, t, hidden]``. The frames' K/V (``[B, kv_heads, ≤ G, head_dim]`` per layer) grow
        in ``kv``: a list (concatenated per step) or a :class:`PredictorWorkspace` (written in place). The
        model's layers and weights, in a lean loop: no paged cache or flat batch for a sequence of at most
        ``G`` rows (G − 1 steps per frame, where per-op overhead is most of the time)."""
        b, t, _ = x.shape
        rope = None
        for i, layer in enumerate(self.model.layers):
            a = layer.self_attn
            qkv = a.qkv_proj(_norm(layer.input_layernorm, x))
            q, k, v = qkv.split((a.q_size, a.kv_size, a.kv_size), dim=-1)
            q = q.reshape(b, t, a.num_heads, a.head_dim)
            k = k.reshape(b, t, a.num_kv_heads, a.head_dim)
            if a.q_norm is not None:
                q, k = _norm(a.q_norm, q), _norm(a.k_norm, k)
            if a.use_cpu_ops:  # one C++ call, in place, bit-equal to apply_rotary (kernels/cpu_ops.py)
                if rope is None:
                    rope = (cos.repeat(b, 1), sin.repeat(b, 1))  # [B·t, D]: every frame's positions
                torch.ops.omniduplex_cpu.rotary_(
                    q.view(b * t, *q.shape[2:]), k.view(b * t, *k.shape[2:]), *rope
                )
                q, k = q.transpose(1, 2), k.transpose(1, 2)
            else:
                q, k = apply_rotary(q, cos, sin).transpose(1, 2), apply_rotary(k, cos, sin).transpose(1, 2)
            v = v.reshape(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)
            if isinstance(kv, PredictorWorkspace):
                kb, vb = kv.k[i, :b], kv.v[i, :b]
                kb[:, :, pos : pos + t] = k
                vb[:, :, pos : pos + t] = v
                k, v = kb[:, :, : pos + t], vb[:, :, : pos + t]
            else:
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

    def _first_rows(self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor) -> torch.Tensor:
        """``[B, 2, hidden]``: the projected hidden state and the code-0 embedding (positions 0 and 1)."""
        if self.project_codes:
            return self._project(torch.stack((talker_hidden, code0_embed), dim=1))
        return torch.stack((self._project(talker_hidden), code0_embed), dim=1)

    def _workspace(self, b: int, like: torch.Tensor) -> PredictorWorkspace:
        ws = self.workspace
        if ws is None or not ws.fits(b, like.dtype, like.device):
            grown = PredictorWorkspace(self, max(b, ws.capacity if ws else 0), like.dtype, like.device)
            grown.allocations += ws.allocations if ws else 0
            self.workspace = ws = grown
        return ws

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
            talker_hidden: ``[B, talker_hidden]`` talker final hidden state that produced ``code0``.
            code0: int64 ``[B]`` codebook-0 ids.
            code0_embed: ``[B, embed_dim]`` the embedding of ``code0`` this predictor reads at position 1.
            sample: picks one code per frame from fp32 logits ``[B, vocab]``.

        Returns:
            int64 ``[B, G]``: the full frame, ``code0`` first.
        """
        b, g_total = code0.shape[0], self.num_code_groups
        if b == 0:
            return code0.new_zeros((0, g_total))
        codes = [code0]
        x = self._first_rows(talker_hidden, code0_embed)  # [B, 2, hidden]
        if self.static_buffers:
            ws = self._workspace(b, x)
            ws.rows[:2, :b] = x.transpose(0, 1)
            x, cos, sin, kv = ws.rows[:2, :b].transpose(0, 1), ws.cos, ws.sin, ws
        else:
            cos, sin = self.model.rotary(torch.arange(g_total, device=x.device))  # positions 0..G−1
            kv = [None] * len(self.model.layers)
        for g in range(1, g_total):
            pos = 0 if g == 1 else g
            hidden = self._step(x, pos, cos[pos : pos + x.shape[1]], sin[pos : pos + x.shape[1]], kv)
            code = sample(self.head(g)(hidden[:, -1]).float(), g)
            codes.append(code)
            if g == g_total - 1:
                break
            if self.static_buffers and not self.project_codes:
                # the lookup writes the next input (position g + 1) into its row of the buffer
                row = kv.rows[g + 1, :b]
                torch.index_select(self.embedding(g).weight, 0, code, out=row)
                x = row[:, None]
            else:
                x = self.embedding(g)(code)[:, None]
                x = self._project(x) if self.project_codes else x
                if self.static_buffers:
                    kv.rows[g + 1, :b] = x[:, 0]
        return torch.stack(codes, dim=1)
