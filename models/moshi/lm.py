"""The Moshi LM (arXiv 2410.00037 §3.4, "RQ-Transformer"; tensor names of ``moshi/models/lm.py``).

Per 80 ms frame ``s`` the temporal transformer reads the sum of 17 embeddings (text ``text_emb``, model audio
``emb.0..7``, user audio ``emb.8..15``; id ``card`` / ``text_card`` is the initial token, -1 embeds to zero)
and gives ``z_s`` ``[B, dim]``; ``out_norm`` then ``text_linear`` give the text logits (the "inner
monologue").
The depth transformer then predicts the frame's 8 model codebooks one after another: step ``k`` reads
``depformer_in.k(z_s) + emb(token_{k-1})`` (token ``-1`` is the text token, ``depformer_text_emb``;
otherwise ``depformer_emb.{k-1}``), attends over the frame's earlier steps and emits ``linears.k`` logits.

Streams carry acoustic delays (``delays``, §3.4.4): the token of stream ``i`` for frame ``s`` is fed at
step ``s + delay_i``. :class:`MoshiLM.step` keeps each row's delayed token ring and hands back undelayed
frames once ``max(delays)`` steps have passed (``None`` rows before that are marked -2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from omniduplex.models.moshi.streaming import Streaming
from omniduplex.models.moshi.transformer import Transformer, make_norm


class ScaledEmbedding(nn.Embedding):
    """``nn.Embedding`` where id -1 ("zero token") embeds to a zero vector. ids ``[...]`` → ``[..., dim]``."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y = super().forward(ids.clamp(min=0))
        return torch.where((ids == -1)[..., None], torch.zeros((), dtype=y.dtype, device=y.device), y)


@dataclass
class Sampling:
    """Per-row sampling settings as tensors ``[B]``: temperature (<= 0 means greedy) and top-k, for the text
    and the audio tokens (Moshi's defaults: text 0.7 / 25, audio 0.8 / 250, ``moshi/models/lm.py``
    ``LMGen``)."""

    temp_text: torch.Tensor
    top_k_text: torch.Tensor
    temp_audio: torch.Tensor
    top_k_audio: torch.Tensor
    any_sampling: bool | None = None
    """Host-side hint: ``False`` when every row is greedy (skips the sort), ``True`` when some row samples,
    ``None`` to find out from the tensors (a host sync; CUDA-graph callers pass a bool)."""
    top_k_bound: int | None = None
    """Host-side bound on every row's top-k (text and audio), the size of the partial top-k; ``None``: the
    vocabulary size (what a CUDA graph captured for any settings must use)."""

    @staticmethod
    def greedy(rows: int, device: torch.device | str = "cpu") -> Sampling:
        z = torch.zeros(rows, device=device)
        k = torch.ones(rows, dtype=torch.long, device=device)
        return Sampling(z, k, z.clone(), k.clone(), any_sampling=False)


def sample(
    logits: torch.Tensor,
    temp: torch.Tensor,
    top_k: torch.Tensor,
    generator: torch.Generator | None = None,
    any_sampling: bool | None = None,
    top_k_bound: int | None = None,
) -> torch.Tensor:
    """One token per row: ``logits`` ``[B, V]``, ``temp`` float ``[B]``, ``top_k`` int64 ``[B]`` → int64
    ``[B]``.
    Rows with ``temp <= 0`` take the argmax; others sample ``softmax(logits / temp)`` restricted to the
    ``top_k`` largest logits (ties at the k-th value are kept). One batched call for all rows, no per-row
    Python. ``any_sampling``: see :attr:`Sampling.any_sampling`; ``top_k_bound``: a host-side bound on
    ``top_k`` (the partial top-k's size; ``None``: the vocabulary)."""
    greedy = logits.argmax(dim=-1)
    if any_sampling is None:
        any_sampling = bool((temp > 0).any())
    if not any_sampling:
        return greedy
    # the top-k threshold per row: the k-th largest logit (a partial top-k over the largest k of any row
    # instead of a full sort of the vocabulary)
    k_max = min(int(top_k_bound) if top_k_bound is not None else logits.shape[-1], logits.shape[-1])
    vals = logits.float().topk(k_max, dim=-1).values
    kth = vals.gather(1, (top_k.clamp(min=1, max=k_max) - 1)[:, None])
    scaled = logits.float() / temp.clamp(min=1e-5)[:, None]
    probs = torch.softmax(torch.where(logits.float() >= kth, scaled, float("-inf")), dim=-1)
    # one draw from ``probs``: argmax of probs / Exp(1) noise (the exponential race that torch.multinomial
    # runs for one sample), without multinomial's input checks
    noise = torch.empty_like(probs).exponential_(generator=generator)
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(temp > 0, drawn, greedy)


class DelayState(Streaming):
    """Per-row ring of delayed tokens ``cache`` int64 ``[rows, 17, max_delay + 2]`` (-2 = not yet generated)
    and ``offset`` (frames stepped)."""

    def __init__(self, streams: int, depth: int) -> None:
        super().__init__()
        self.streams, self.depth = streams, depth
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # follows the model's device

    def new_state(self, rows: int) -> dict[str, torch.Tensor]:
        dev = self.anchor.device
        return {
            "cache": torch.full((rows, self.streams, self.depth), -2, dtype=torch.long, device=dev),
            "offset": torch.zeros(rows, dtype=torch.long, device=dev),
        }

    def fresh_row_values(self) -> dict[str, float]:
        return {"cache": -2}


class MoshiLM(nn.Module):
    """Temporal + depth transformer over text and two audio streams. ``cfg``: ``lm_kwargs`` of
    :func:`~.config.lm_config`."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        dim, ddim, card, text = cfg["dim"], cfg["depformer_dim"], cfg["card"], cfg["text_card"]
        self.n_q, self.dep_q, self.card, self.text_card = cfg["n_q"], cfg["dep_q"], card, text
        self.delays = list(cfg["delays"])
        if len(self.delays) != self.n_q + 1:
            raise ValueError(f"expected {self.n_q + 1} delays, got {len(self.delays)}")
        self.emb = nn.ModuleList([ScaledEmbedding(card + 1, dim) for _ in range(self.n_q)])
        self.text_emb = ScaledEmbedding(text + 1, dim)
        self.text_linear = nn.Linear(dim, text, bias=False)
        self.transformer = Transformer(
            dim,
            cfg["num_heads"],
            cfg["num_layers"],
            int(cfg["hidden_scale"] * dim),
            cfg["norm"],
            cfg["gating"],
            cfg["context"],
            cfg["positional_embedding"],
            cfg["max_period"],
            cfg["layer_scale"],
        )
        self.out_norm = make_norm(cfg["norm"], dim)
        self.depformer_in = nn.ModuleList([nn.Linear(dim, ddim, bias=False) for _ in range(self.dep_q)])
        self.depformer_emb = nn.ModuleList([ScaledEmbedding(card + 1, ddim) for _ in range(self.dep_q - 1)])
        self.depformer_text_emb = ScaledEmbedding(text + 1, ddim)
        self.depformer = Transformer(
            ddim,
            cfg["depformer_num_heads"],
            cfg["depformer_num_layers"],
            cfg["depformer_dim_feedforward"],
            cfg["norm"],
            cfg["depformer_gating"],
            None,
            cfg["depformer_pos_emb"],
            cfg["depformer_max_period"],
            cfg["depformer_layer_scale"],
            steps=self.dep_q,
        )
        self.linears = nn.ModuleList([nn.Linear(ddim, card, bias=False) for _ in range(self.dep_q)])
        self.tokens = DelayState(self.n_q + 1, max(self.delays) + 2)
        self.register_buffer("delay_table", torch.tensor(self.delays, dtype=torch.long), persistent=False)
        initial = [self.text_card] + [self.card] * self.n_q  # the initial token of each stream
        self.register_buffer("initial_tokens", torch.tensor(initial, dtype=torch.long), persistent=False)

    def forward_text(self, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One temporal step. ``frame`` int64 ``[B, 17]`` (text, audio streams) → ``z`` ``[B, 1, dim]`` (after
        ``out_norm``) and text logits ``[B, text_card]``."""
        x = self.emb[0](frame[:, 1:2])
        for k in range(1, self.n_q):
            x = x + self.emb[k](frame[:, k + 1 : k + 2])
        x = x + self.text_emb(frame[:, :1])
        z = self.out_norm(self.transformer(x))
        return z, self.text_linear(z)[:, 0]

    def depth(
        self,
        z: torch.Tensor,
        text: torch.Tensor,
        sampling: Sampling,
        generator: torch.Generator | None = None,
        force: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The depth transformer over one frame for all rows at once: ``z`` ``[B, 1, dim]``, ``text`` int64
        ``[B]`` → audio tokens int64 ``[B, dep_q]``. Its KV cache lives for the frame only. ``force`` int64
        ``[B, dep_q]``: where ``>= 0``, that codebook's token replaces the sampled one (and conditions the
        next codebooks), as :meth:`step` describes."""
        b = z.shape[0]
        attn = [layer.self_attn for layer in self.depformer.layers]
        if attn[0].max_period is None:  # the published depformer (no RoPE): frame-local KV, reused
            kv = self._frame_kv(b, z)
            for i, a in enumerate(attn):
                a.frame_kv = kv[i]
        else:
            for a in attn:
                a.state = a.new_state(b)
        prev, out = text, []
        try:
            for k in range(self.dep_q):
                emb = self.depformer_text_emb if k == 0 else self.depformer_emb[k - 1]
                x = self.depformer_in[k](z) + emb(prev[:, None])
                logits = self.linears[k](self.depformer(x, step=k))[:, 0]
                temp, top_k = sampling.temp_audio, sampling.top_k_audio
                prev = sample(logits, temp, top_k, generator, sampling.any_sampling, sampling.top_k_bound)
                if force is not None:
                    prev = torch.where(force[:, k] >= 0, force[:, k], prev)
                out.append(prev)
        finally:
            for a in attn:
                a.state = a.frame_kv = None
        return torch.stack(out, 1)

    def _frame_kv(self, b: int, z: torch.Tensor) -> torch.Tensor:
        """The depth transformer's frame-local KV ``[layers, 2, b, heads, dep_q, head_dim]`` (rows ``[:b]``
        of a buffer kept across frames and grown when more rows come: no allocation per frame)."""
        a = self.depformer.layers[0].self_attn
        shape = (len(self.depformer.layers), 2, b, a.heads, self.dep_q, a.dim // a.heads)
        buf = getattr(self, "_depth_kv", None)
        if buf is None or buf.shape[2] < b or buf.dtype != z.dtype or buf.device != z.device:
            cap = self.tokens.state["cache"].shape[0] if self.tokens.state is not None else b
            # sized for the streaming capacity at once (a captured graph keeps its pointers)
            buf = torch.empty((*shape[:2], max(b, cap), *shape[3:]), dtype=z.dtype, device=z.device)
            self._depth_kv = buf
        return buf[:, :, :b]

    @torch.no_grad()
    def step(
        self,
        user: torch.Tensor,
        sampling: Sampling,
        generator: torch.Generator | None = None,
        force: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance every row one frame. ``user`` int64 ``[B, 8]``: the user's Mimi codes for this frame.
        ``force`` int64 ``[B, 1 + dep_q]`` (optional): the model's own tokens of this step where ``>= 0``
        (text, then codebooks as the step generates them, i.e. codebook ``k`` of frame ``t - delays[k]``),
        sampled where ``-1``: the prompt prefill of PersonaPlex's voice and role prompts
        (:mod:`omniduplex.pipeline.duplex.prompts`) rides on the batched step this way.
        Returns ``(tokens, ready)``: int64 ``[B, 1 + dep_q]`` (text, model audio codebooks) for the frame
        ``max(delays)`` steps back, and bool ``[B]`` (False while a row is still within its first
        ``max(delays)`` steps; those rows hold -2). Requires streaming
        (:func:`~.streaming.start_streaming`)."""
        st = self.tokens.rows(user.shape[0])
        cache, offset = st["cache"], st["offset"]
        b, ct = user.shape[0], cache.shape[2]
        delays = self.delay_table
        user_rows = slice(self.dep_q + 1, self.n_q + 1)
        pos = (offset[:, None] + delays[user_rows][None]) % ct
        cache[:, user_rows].scatter_(2, pos[..., None], user[..., None])
        initial = self.initial_tokens
        frame = cache.gather(2, (offset % ct)[:, None, None].expand(-1, self.n_q + 1, 1))[..., 0]
        frame = torch.where(offset[:, None] <= delays[None], initial[None], frame)
        z, text_logits = self.forward_text(frame)
        text = sample(
            text_logits,
            sampling.temp_text,
            sampling.top_k_text,
            generator,
            sampling.any_sampling,
            sampling.top_k_bound,
        )
        if force is not None:
            text = torch.where(force[:, 0] >= 0, force[:, 0], text)
        audio = self.depth(z, text, sampling, generator, None if force is None else force[:, 1:])
        offset.add_(1)
        here = (offset % ct)[:, None, None]
        gen = torch.cat([text[:, None], audio], 1)
        cache[:, : self.dep_q + 1].scatter_(2, here.expand(-1, self.dep_q + 1, 1), gen[..., None])
        lag = max(self.delays)
        idx = (offset[:, None] - lag + delays[None, : self.dep_q + 1]) % ct
        out = cache[:, : self.dep_q + 1].gather(2, idx[..., None])[..., 0]
        ready = offset > lag
        return torch.where(ready[:, None], out, torch.full_like(out, -2)), ready[:b].clone()
