"""An independent float64 reference of Fish Speech S2 Pro's Dual-AR generation, for the tests.

Written from the published description (Fish Audio S2 technical report; ``fish_speech/models/text2semantic/
llama.py``'s ``DualARTransformer`` and ``inference.py``'s ``decode_one_token_ar``, read for the math only) and
the checkpoint's ``config.json``; it imports nothing of ``omniduplex``. Plain torch, float64, one sequence, no
KV cache at all (every step recomputes the whole sequence), weights read by their published names:

- slow AR input row: ``embeddings[t]``; at a semantic token plus ``Σ_i codebook_embeddings[c_i + i·S]``, the
  sum divided by ``√(N + 1)``;
- blocks: ``h = x + wo(attn(attention_norm(x)))``, ``x = h + w2(silu(w1(ffn_norm(h))) · w3(ffn_norm(h)))``;
  attention: ``wqkv`` split into q, k, v; per-head RMSNorm of q and k when ``attention_qk_norm``; RoPE on
  interleaved pairs ``(x_{2i}, x_{2i+1})`` with the cos/sin table computed in float32 and stored in bf16;
  causal softmax(q·kᵀ/√d)·v with each KV head shared by ``n_head / n_local_heads`` query heads;
- slow output: final RMSNorm; token logits by the (tied) embedding; greedy over the semantic tokens and
  ``<|im_end|>``;
- fast AR: the sequence ``[fast_project_in(h), embeddings[c_0], …]`` (``h`` the slow AR's normed output; no
  projection when the widths agree) at positions ``0, 1, …``; its own RoPE table (the slow AR's base); the
  output at position ``g`` (through ``norm`` and ``output``) gives ``c_g`` greedily.

Generation stops at ``<|im_end|>`` or when the ``max_new_tokens``-th codebook-0 id is drawn; those ids get no
frame (the engine's convention).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

SYSTEM = "convert the provided text to speech reference to the following:\n\nText:\n"


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope_table(n: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[n, head_dim / 2]`` float64, through float32 and bf16 as the published table is."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    ang = torch.outer(torch.arange(n).float(), inv)
    return ang.cos().bfloat16().double(), ang.sin().bfloat16().double()


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, H, D]``: pair ``(x_{2i}, x_{2i+1})`` rotated by angle ``i`` of its position."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


class Stack:
    """One decoder (slow or fast) as plain float64 tensors under ``prefix``."""

    def __init__(self, w: dict, prefix: str, cfg: dict, rope_base: float, eps: float, max_len: int) -> None:
        self.w, self.prefix, self.eps = w, prefix, eps
        self.heads, self.kv = cfg["n_head"], cfg["n_local_heads"]
        self.hd, self.layers, self.qk_norm = cfg["head_dim"], cfg["n_layer"], cfg["attention_qk_norm"]
        self.cos, self.sin = _rope_table(max_len, self.hd, rope_base)

    def _p(self, name: str) -> torch.Tensor | None:
        return self.w.get(self.prefix + name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[T, dim]`` (positions ``0..T−1``) → the normed final hidden ``[T, dim]``."""
        t = x.shape[0]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        cos, sin = self.cos[:t], self.sin[:t]
        for i in range(self.layers):
            p = f"layers.{i}."
            h = _rms(x, self._p(p + "attention_norm.weight"), self.eps)
            qkv = h @ self._p(p + "attention.wqkv.weight").t()
            if self._p(p + "attention.wqkv.bias") is not None:
                qkv = qkv + self._p(p + "attention.wqkv.bias")
            q_rows, kv_rows = self.heads * self.hd, self.kv * self.hd
            q = qkv[:, :q_rows].reshape(t, self.heads, self.hd)
            k = qkv[:, q_rows : q_rows + kv_rows].reshape(t, self.kv, self.hd)
            v = qkv[:, q_rows + kv_rows :].reshape(t, self.kv, self.hd)
            if self.qk_norm:
                q = _rms(q, self._p(p + "attention.q_norm.weight"), self.eps)
                k = _rms(k, self._p(p + "attention.k_norm.weight"), self.eps)
            q, k = _rotate_pairs(q, cos, sin), _rotate_pairs(k, cos, sin)
            rep = self.heads // self.kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.hd)
            att = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            out = torch.einsum("hqk,khd->qhd", att, v).reshape(t, q_rows)
            out = out @ self._p(p + "attention.wo.weight").t()
            if self._p(p + "attention.wo.bias") is not None:
                out = out + self._p(p + "attention.wo.bias")
            x = x + out
            h = _rms(x, self._p(p + "ffn_norm.weight"), self.eps)
            gate = h @ self._p(p + "feed_forward.w1.weight").t()
            up = h @ self._p(p + "feed_forward.w3.weight").t()
            x = x + (torch.nn.functional.silu(gate) * up) @ self._p(p + "feed_forward.w2.weight").t()
        return _rms(x, self._p("norm.weight"), self.eps)


class FishReference:
    """The whole Dual-AR of a checkpoint folder (``config.json`` + ``model.safetensors``)."""

    def __init__(self, model_dir: str | Path) -> None:
        d = Path(model_dir)
        cfg = json.loads((d / "config.json").read_text())
        self.w = {k: v.double() for k, v in load_file(str(d / "model.safetensors")).items()}
        tc, fc = dict(cfg["text_config"]), dict(cfg["audio_decoder_config"])
        for key in ("n_local_heads", "head_dim", "attention_qk_norm", "intermediate_size"):
            fc.setdefault(key, tc[key])  # absent fast keys take the slow AR's value
        self.n, self.size = fc["num_codebooks"], fc["vocab_size"]
        self.sb, self.se, self.im_end = (
            cfg["semantic_start_token_id"],
            cfg["semantic_end_token_id"],
            cfg["eos_token_id"],
        )
        eps, base = tc["norm_eps"], tc["rope_base"]
        self.slow = Stack(self.w, "text_model.model.", tc, base, eps, tc["max_seq_len"])
        self.fast = Stack(self.w, "audio_decoder.", fc, base, eps, self.n)
        self.tied = tc.get("tie_word_embeddings", True)

    def prompt_ids(self, tok, text: str, ref: tuple[torch.Tensor, str] | None = None) -> list[int]:
        """The published prompt (vLLM-Omni's ``build_fish_voice_clone_prompt_ids``) for ``text`` and an
        optional reference ``(codes [N, T], transcript)``."""

        def enc(s: str) -> list[int]:
            return tok.encode(s, add_special_tokens=False).ids

        def special(s: str) -> int:
            return tok.token_to_id(s)

        ids = []
        if ref is not None:
            codes, transcript = ref
            ids += [special("<|im_start|>")] + enc("system\n")
            ids += enc(SYSTEM + "<|speaker:0|>" + transcript + "\n\nSpeech:\n") + [special("<|audio_start|>")]
            ids += [self.sb + int(c) for c in codes[0]]
            ids += [special("<|audio_end|>"), special("<|im_end|>")] + enc("\n")
        ids += [special("<|im_start|>")] + enc("user\n") + enc(text) + [special("<|im_end|>")] + enc("\n")
        ids += [special("<|im_start|>")] + enc("assistant\n") + [special("<|voice|>")]
        return ids

    def _row(self, token: int, codes: torch.Tensor | None) -> torch.Tensor:
        x = self.w["text_model.model.embeddings.weight"][token]
        if self.sb <= token <= self.se:
            table = self.w["audio_decoder.codebook_embeddings.weight"]
            vq = torch.stack([table[int(codes[i]) + i * self.size] for i in range(self.n)]).sum(0)
            x = (x + vq) / math.sqrt(self.n + 1)
        return x

    def _frame(self, h: torch.Tensor, c0: int) -> list[int]:
        emb = self.w["audio_decoder.embeddings.weight"]
        proj = self.w.get("audio_decoder.fast_project_in.weight")
        first = h if proj is None else h @ proj.t() + self.w["audio_decoder.fast_project_in.bias"]
        seq, codes = [first, emb[c0]], [c0]
        for _ in range(1, self.n):
            out = self.fast.forward(torch.stack(seq))[-1]
            code = int((out @ self.w["audio_decoder.output.weight"].t()).argmax())
            codes.append(code)
            seq.append(emb[code])
        return codes

    def prompt_rows(self, ids: list[int], ref_codes: torch.Tensor | None, first: int) -> list[torch.Tensor]:
        """Slow-AR input rows of the prompt (semantic tokens from index ``first`` carry ``ref_codes``)."""
        return [
            self._row(t, ref_codes[:, j - first] if self.sb <= t <= self.se else None)
            for j, t in enumerate(ids)
        ]

    def token_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary of a normed slow-AR output row."""
        head = self.w["text_model.model.embeddings.weight" if self.tied else "text_model.model.output.weight"]
        return h @ head.t()

    @property
    def allowed(self) -> torch.Tensor:
        """0 at the semantic tokens and ``<|im_end|>``, −inf elsewhere (the reference's logit bias)."""
        v = self.w["text_model.model.embeddings.weight"].shape[0]
        bias = torch.full((v,), float("-inf"), dtype=torch.float64)
        bias[self.sb : self.se + 1] = 0
        bias[self.im_end] = 0
        return bias

    def fast_logits(self, h: torch.Tensor, c0: int) -> torch.Tensor:
        """The fast AR's logits for codebook 1 given the slow AR's output ``h`` and code 0."""
        proj = self.w.get("audio_decoder.fast_project_in.weight")
        first = h if proj is None else h @ proj.t() + self.w["audio_decoder.fast_project_in.bias"]
        seq = torch.stack((first, self.w["audio_decoder.embeddings.weight"][c0]))
        return self.fast.forward(seq)[-1] @ self.w["audio_decoder.output.weight"].t()

    @torch.no_grad()
    def generate(
        self, ids: list[int], ref_codes: torch.Tensor | None = None, first: int = -1, max_new_tokens: int = 16
    ) -> list[list[int]]:
        """Greedy frames ``[F][N]`` after prompt ``ids`` whose semantic tokens (from index ``first``) carry
        the columns of ``ref_codes`` ``[N, T]``."""
        rows = self.prompt_rows(ids, ref_codes, first)
        frames = []
        for step in range(max_new_tokens):
            h = self.slow.forward(torch.stack(rows))[-1]
            token = int((self.token_logits(h) + self.allowed).argmax())
            if token == self.im_end or step == max_new_tokens - 1:
                break
            frame = self._frame(h, token - self.sb)
            frames.append(frame)
            rows.append(self._row(token, torch.tensor(frame)))
        return frames
