"""Parity of our Moshi LM (models/moshi/lm.py) with transformers' ``MoshiForConditionalGeneration`` (5.19),
the oracle (test-only: no code of it is used by the package).

One random preset (``tiny``, whose 32-frame context makes the ring KV wrap, and ``small``) is renamed here to
transformers' layout with the same weights: ``in_proj_weight`` split into ``q_proj`` / ``k_proj`` /
``v_proj`` (q and k rows permuted from Kyutai's interleaved RoPE pairs to transformers' rotate-half order;
the depth transformer has no RoPE), the per-codebook depth weights stacked into ``MoshiFlexibleLinear``
tensors ``[8, out, in]``, RMSNorm ``alpha`` ``[1, 1, D]`` → ``weight`` ``[D]``.

What is compared, and why this way: transformers implements the networks (temporal transformer, text head,
depth decoder with one weight set per codebook) but drives them through ``generate()``, whose delay handling
and nested depth ``generate()`` are its own (and its embeddings have no Kyutai "zero token" id -1). So the
test drives transformers' modules one frame at a time with Kyutai's acoustic-delay bookkeeping written out
here (``moshi/models/lm.py`` ``LMGen``: stream ``i`` is fed its token ``delays[i]`` frames late, the initial
token before that) and its own greedy outputs fed back, and our :meth:`MoshiLM.step` runs on the same fixed
user codes. In fp32 over 52 frames: the same text tokens and the same 8 audio codes per frame.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MimiConfig, MoshiConfig, MoshiForConditionalGeneration
from transformers.cache_utils import DynamicCache

from omniduplex.models.moshi.checkpoint import published_state, random_models
from omniduplex.models.moshi.config import lm_config
from omniduplex.models.moshi.lm import MoshiLM, Sampling
from omniduplex.models.moshi.streaming import start_streaming

FRAMES = 52


def _hidden(cfg_dim: int, ff: int) -> int:
    """The gated FFN's hidden width (``moshi/modules/gating.py``); transformers' ``ffn_dim`` is twice it."""
    return (21 * cfg_dim) // 8 if ff == 4 * cfg_dim else (2 * ff) // 3


def hf_config(preset: str) -> MoshiConfig:
    c = lm_config(preset)
    depth = dict(
        hidden_size=c["depformer_dim"],
        input_size=c["dim"],
        num_hidden_layers=c["depformer_num_layers"],
        num_attention_heads=c["depformer_num_heads"],
        num_key_value_heads=c["depformer_num_heads"],
        head_dim=c["depformer_dim"] // c["depformer_num_heads"],
        audio_vocab_size=c["card"],
        vocab_size=c["text_card"],
        ffn_dim=2 * _hidden(c["depformer_dim"], c["depformer_dim_feedforward"]),
        sliding_window=c["dep_q"],
        max_position_embeddings=c["dep_q"] + 1,
        rms_norm_eps=1e-8,
        num_codebooks=c["dep_q"],
    )
    mimi = MimiConfig(  # a minimal codec: the audio encoder is not part of the comparison
        hidden_size=32,
        num_filters=4,
        codebook_size=c["card"],
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        upsample_groups=32,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
    ).to_dict()
    cfg = MoshiConfig(
        vocab_size=c["text_card"],
        hidden_size=c["dim"],
        num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"],
        num_key_value_heads=c["num_heads"],
        head_dim=c["dim"] // c["num_heads"],
        audio_vocab_size=c["card"],
        max_position_embeddings=c["context"],
        sliding_window=c["context"],
        rope_parameters={"rope_type": "default", "rope_theta": float(c["max_period"])},
        ffn_dim=2 * _hidden(c["dim"], int(c["hidden_scale"] * c["dim"])),
        rms_norm_eps=1e-8,
        num_codebooks=c["dep_q"],
        audio_encoder_config=mimi,
        depth_decoder_config=depth,
    )
    cfg._attn_implementation = "eager"
    cfg.depth_decoder_config._attn_implementation = "eager"
    return cfg


def _half_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q/k projection from interleaved (re, im) pairs to rotate-half order, per head."""
    d1, d2 = w.shape
    return w.view(heads, d1 // heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2)


def to_hf(lm: MoshiLM) -> dict[str, torch.Tensor]:
    """Our LM's published tensors under ``MoshiForConditionalGeneration``'s names (module docstring)."""
    s, c = published_state(lm), lm.cfg
    dim, ddim, k_n = c["dim"], c["depformer_dim"], c["dep_q"]
    out = {"decoder.model.embed_tokens.weight": s["text_emb.weight"]}
    out |= {f"embed_tokens.{i}.weight": s[f"emb.{i}.weight"] for i in range(c["n_q"])}
    out["decoder.lm_head.weight"] = s["text_linear.weight"]
    out["decoder.model.norm.weight"] = s["out_norm.alpha"].reshape(-1)
    for i in range(c["num_layers"]):
        src, dst = f"transformer.layers.{i}.", f"decoder.model.layers.{i}."
        q, k, v = s[src + "self_attn.in_proj_weight"].chunk(3, 0)
        out[dst + "self_attn.q_proj.linear.weight"] = _half_rope(q, c["num_heads"])
        out[dst + "self_attn.k_proj.linear.weight"] = _half_rope(k, c["num_heads"])
        out[dst + "self_attn.v_proj.linear.weight"] = v
        out[dst + "self_attn.o_proj.linear.weight"] = s[src + "self_attn.out_proj.weight"]
        out[dst + "input_layernorm.weight"] = s[src + "norm1.alpha"].reshape(-1)
        out[dst + "post_attention_layernorm.weight"] = s[src + "norm2.alpha"].reshape(-1)
        out[dst + "mlp.fc1.weight"] = s[src + "gating.linear_in.weight"]
        out[dst + "mlp.fc2.weight"] = s[src + "gating.linear_out.weight"]
    d = "depth_decoder."
    out[d + "text_embed_tokens.weight"] = s["depformer_text_emb.weight"]
    out |= {f"{d}embed_tokens.{j}.weight": s[f"depformer_emb.{j}.weight"] for j in range(k_n - 1)}
    out[d + "input_projections.weight"] = torch.stack([s[f"depformer_in.{j}.weight"] for j in range(k_n)])
    out[d + "lm_heads.weight"] = torch.stack([s[f"linears.{j}.weight"] for j in range(k_n)])
    for i in range(c["depformer_num_layers"]):
        src, dst = f"depformer.layers.{i}.", f"{d}layers.{i}."
        per_step = s[src + "self_attn.in_proj_weight"].view(k_n, 3, ddim, ddim)
        for j, name in enumerate(("q", "k", "v")):
            out[dst + f"self_attn.{name}_proj.linear.weight"] = per_step[:, j]
        out[dst + "self_attn.o_proj.linear.weight"] = s[src + "self_attn.out_proj.weight"].view(
            k_n, ddim, ddim
        )
        out[dst + "input_layernorm.weight"] = s[src + "norm1.alpha"].reshape(-1)
        out[dst + "post_attention_layernorm.weight"] = s[src + "norm2.alpha"].reshape(-1)
        for name, ours in (("fc1", "linear_in"), ("fc2", "linear_out")):
            out[dst + f"mlp.{name}.weight"] = torch.stack(
                [s[f"{src}gating.{j}.{ours}.weight"] for j in range(k_n)]
            )
    assert dim == out["decoder.lm_head.weight"].shape[1]
    return out


def _hf_frames(hf: MoshiForConditionalGeneration, lm: MoshiLM, user: torch.Tensor) -> torch.Tensor:
    """transformers' modules, greedy, one frame at a time with Kyutai's delays: ``user`` int64 ``[8, F]`` →
    the undelayed frames int64 ``[9, F - 1]`` (text, model audio codebooks 0..7)."""
    delays, k_n = lm.delays, lm.dep_q
    initial = [lm.text_card] + [lm.card] * lm.n_q
    cache = DynamicCache(config=hf.config)
    gen: list[list[int]] = []  # per step: text, audio 0..7 as generated (delayed streams)
    for s in range(user.shape[1]):
        frame = []
        for i in range(1 + lm.n_q):
            if s <= delays[i]:
                frame.append(initial[i])
            elif i <= k_n:
                frame.append(gen[s - 1][i])
            else:
                frame.append(int(user[i - k_n - 1, s - delays[i]]))
        ids = torch.tensor(frame)[None, :, None]  # [1, 17, 1]
        emb = hf.decoder.model.embed_tokens(ids[:, 0])
        emb = emb + sum(hf.embed_tokens[j](ids[:, 1 + j]) for j in range(lm.n_q))
        out = hf.decoder(inputs_embeds=emb, past_key_values=cache, use_cache=True)
        text = int(out.logits[0, -1].argmax())
        z, prev, dcache, step = out.last_hidden_state, text, DynamicCache(), [text]
        for _ in range(k_n):
            d = hf.depth_decoder(
                input_ids=torch.tensor([[prev]]), last_hidden_state=z, past_key_values=dcache, use_cache=True
            )
            prev = int(d.logits[0, -1].argmax())
            step.append(prev)
        gen.append(step)
    g = torch.tensor(gen).T  # [9, F] generated per step
    lag = max(delays)
    cols = [[g[i, s - lag + delays[i]] for i in range(1 + k_n)] for s in range(lag, user.shape[1])]
    return torch.tensor(cols).T


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_lm_matches_transformers_moshi(preset):
    lm, _ = random_models(preset, 0)
    lm.eval()
    hf = MoshiForConditionalGeneration(hf_config(preset)).eval()
    missing, unexpected = hf.load_state_dict(to_hf(lm), strict=False)
    assert not unexpected and all(k.startswith("audio_encoder.") for k in missing), missing
    g = torch.Generator().manual_seed(3)
    user = torch.randint(0, lm.card, (8, FRAMES), generator=g)
    with torch.no_grad():
        want = _hf_frames(hf, lm, user)
        start_streaming(lm, 1)
        got = []
        for s in range(FRAMES):
            tokens, ready = lm.step(user[None, :, s], Sampling.greedy(1))
            if bool(ready[0]):
                got.append(tokens[0])
    got_t = torch.stack(got, -1)
    assert got_t.shape == want.shape == (9, FRAMES - 1)
    assert len(set(got_t[0].tolist())) > 1 and len(set(got_t[1].tolist())) > 1  # not constant streams
    assert torch.equal(got_t, want)
