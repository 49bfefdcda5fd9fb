"""The references the Higgs tests check against, built from ``transformers`` 5.19 and run in the test.

- Talker: ``HiggsAudioV2ForConditionalGeneration`` (the v2 reference model and its ``generate``) holding a
  v3 checkpoint's weights: each layer's attention is ``transformers``' ``Qwen3Attention`` (v3's backbone is
  Qwen3: q/k norms), the v2-only dual FFN gets the layer's own MLP and norms (so both paths are that
  layer), the audio head is the untied head or, tied, the fused embedding. Every parameter is assigned from
  the checkpoint (constructors may leave tensors uninitialised).
- ``transformers`` rules: ``generate`` itself; frames and waveform through ``HiggsAudioV2Processor.
  batch_decode`` (its slicing, ``revert_delay_pattern``, clipping, and the reference tokenizer's decode).
- ``v3`` rules: the model's forward in a per-request loop with the v3 serving rules written out here as
  sglang-omni's per-row ``step`` states them (BOC overwrite in the delay window, codebook 0's EOC → ``N − 2``
  more steps), independent of :mod:`omniduplex.models.higgs.rules`.
- Codec: ``HiggsAudioV2TokenizerModel`` from the checkpoint's ``audio_tokenizer/config.json``, decode-side
  tensors from the checkpoint, every other tensor drawn from a seeded generator.

The tokenizer module imports ``torchaudio`` (only its encoder resamples with it); no CPU wheel exists, so an
empty stand-in module is installed for the import.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import load_file

from omniduplex.models.higgs.prompt import HiggsPrompt


def _stub_torchaudio() -> None:
    if "torchaudio" in sys.modules:
        return
    ta = types.ModuleType("torchaudio")
    ta.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    ta.__version__ = "0.0"
    ta.functional = types.ModuleType("torchaudio.functional")
    sys.modules["torchaudio"], sys.modules["torchaudio.functional"] = ta, ta.functional


def reference_talker(model_dir: Path):
    """The ``transformers`` reference of a checkpoint's talker (module docstring), eval, fp32. Returns
    ``(model, ids)`` with ``ids`` the spare text ids it uses: ``audio_token``, ``delay``, ``eos``."""
    from transformers import HiggsAudioV2Config, HiggsAudioV2ForConditionalGeneration, Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    raw = json.loads((model_dir / "config.json").read_text())
    t, a = raw["text_config"], raw["audio_encoder_config"]
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    audio_start = next(x["id"] for x in tok["added_tokens"] if x["content"] == "<|audio|>")
    v = t["vocab_size"]
    spare = {"audio_token": v - 1, "delay": v - 2, "eos": v - 3}
    dims = {
        k: t[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "vocab_size",
        )
    }
    rope = {"rope_type": "default", "rope_theta": t.get("rope_theta") or 1e6}
    n, cb = a["num_codebooks"], a["vocab_size"]
    cfg = HiggsAudioV2Config(
        **dims,
        rope_parameters=rope,
        max_position_embeddings=t["max_position_embeddings"],
        num_codebooks=n,
        codebook_size=cb,
        audio_token_id=spare["audio_token"],
        audio_delay_token_id=spare["delay"],
        audio_bos_token_id=audio_start,
        audio_stream_bos_id=cb - 2,
        audio_stream_eos_id=cb - 1,
        eos_token_id=spare["eos"],
        pad_token_id=spare["eos"],
        bos_token_id=0,
    )
    cfg._attn_implementation = "eager"  # one attention kind for the causal mask and the swapped layers
    model = HiggsAudioV2ForConditionalGeneration(cfg)
    qcfg = Qwen3Config(**dims, rope_parameters=rope)
    qcfg._attn_implementation = "eager"
    for i, layer in enumerate(model.model.layers):
        layer.self_attn = Qwen3Attention(qcfg, i)
    w = load_file(str(model_dir / "model.safetensors"))
    fused = w["tied.embedding.modality_embeddings.0.embedding.weight"]
    head = fused if a.get("tie_word_embeddings", True) else w["tied.head.modality_heads.0.weight"]
    src = {
        "model.embed_tokens.weight": w["tied.embedding.text_embedding.weight"],
        "model.norm.weight": w["body.norm.weight"],
        "model.embed_audio_tokens.embed_audio_tokens.weight": fused,
        "audio_lm_head.weight": head,
    }
    for name in list(w):
        if name.startswith("body.layers."):
            rest = name[len("body.") :]
            src[f"model.{rest}"] = w[name]
            for text, audio in (
                ("mlp.", "audio_mlp."),
                ("input_layernorm", "audio_input_layernorm"),
                ("post_attention_layernorm", "audio_post_attention_layernorm"),
            ):
                if f".{text}" in rest:
                    src["model." + rest.replace(f".{text}", f".{audio}")] = w[name]
    params = dict(model.named_parameters())
    missing, unused = set(params) - set(src), set(src) - set(params)
    assert not missing and not unused, (sorted(missing)[:3], sorted(unused)[:3])
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(src[name])
    return model.eval().requires_grad_(False), spare


def _inputs(prompt: HiggsPrompt, spare: dict) -> dict:
    audio = prompt.ids < 0
    ids = torch.where(audio, spare["audio_token"], prompt.ids)[None]
    if not bool(audio.any()):
        return {"input_ids": ids}
    rows = prompt.codes[audio][None]
    return {
        "input_ids": ids,
        "audio_input_ids": rows,
        "audio_input_ids_mask": torch.ones(rows.shape[:2], dtype=torch.bool),
    }


def _processor(codec=None, bos: int = 1024, eos: int = 1025):
    from transformers.models.higgs_audio_v2.processing_higgs_audio_v2 import HiggsAudioV2Processor

    ns = types.SimpleNamespace(audio_stream_bos_id=bos, audio_stream_eos_id=eos, audio_tokenizer=codec)
    ns.revert_delay_pattern = lambda x: HiggsAudioV2Processor.revert_delay_pattern(ns, x)
    return HiggsAudioV2Processor, ns


@torch.no_grad()
def generate_transformers(model, spare: dict, prompt: HiggsPrompt, max_new_tokens: int, codec=None):
    """``generate`` (greedy) → ``(frames int64 [F, N], steps, waveform fp32 [samples] or None)``; frames as
    ``HiggsAudioV2Processor.batch_decode`` cuts them, the waveform from its decode with ``codec``."""
    out = model.generate(**_inputs(prompt, spare), max_new_tokens=max_new_tokens, do_sample=False)
    n_prompt_audio = int((prompt.ids < 0).sum())
    gen = out[:, n_prompt_audio:]
    bos, eos = model.config.audio_stream_bos_id, model.config.audio_stream_eos_id
    cls, ns = _processor(codec, bos, eos)
    start = int((gen == bos).all(-1).nonzero()[-1, -1])
    cut = gen[:, start:]
    ends = (cut == eos).all(-1).nonzero()
    end = int(ends[0, 1]) if len(ends) else cut.shape[1]
    frames = ns.revert_delay_pattern(cut[0, 1:end]).clip(0, bos - 1)
    wave = cls.batch_decode(ns, out)[0].reshape(-1) if codec is not None else None
    return frames, gen.shape[1], wave


@torch.no_grad()
def generate_v3(model, spare: dict, prompt: HiggsPrompt, max_new_tokens: int):
    """Greedy v3-rule decoding (module docstring) → ``(frames int64 [F, N], steps)``."""
    n, v = model.config.num_codebooks, model.config.codebook_size
    boc, eoc = v - 2, v - 1
    out = model(**_inputs(prompt, spare), use_cache=True)
    delay_count, countdown, hist = 0, None, []
    for _ in range(max_new_tokens):
        codes = out.logits[0, -1].view(n, v).argmax(-1)
        done = False
        if delay_count < n:
            codes[delay_count + 1 :] = boc
            delay_count += 1
        elif countdown is not None:
            countdown -= 1
            done = countdown <= 0
        elif int(codes[0]) == eoc:
            countdown = n - 2
        hist.append(codes.clone())
        if done:
            break
        out = model(audio_input_ids=codes[None, None], past_key_values=out.past_key_values, use_cache=True)
    steps = torch.stack(hist)
    num = steps.shape[0] - (n - 1)
    frames = torch.stack([steps[c : c + num, c] for c in range(n)], dim=1) if num > 0 else steps[:0]
    return frames.clip(0, boc - 1), steps.shape[0]


def reference_codec(model_dir: Path, seed: int = 0):
    """``HiggsAudioV2TokenizerModel`` of ``model_dir/audio_tokenizer`` (module docstring), eval, fp32."""
    _stub_torchaudio()
    from transformers import HiggsAudioV2TokenizerConfig
    from transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer import (
        HiggsAudioV2TokenizerModel,
    )

    d = model_dir / "audio_tokenizer"
    raw = json.loads((d / "config.json").read_text())
    raw.pop("architectures", None)
    raw.pop("model_type", None)
    model = HiggsAudioV2TokenizerModel(HiggsAudioV2TokenizerConfig(**raw))
    w = load_file(str(d / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                t.copy_(w[name] if name in w else torch.randn(t.shape, generator=g) * 0.02)
    assert set(w) <= set(model.state_dict()), sorted(set(w) - set(model.state_dict()))[:3]
    return model.eval().requires_grad_(False)
