"""Qwen2 on our engine: q/k/v biases, rope theta from the config/GGUF, untied output, GPT-2-style BPE.

The oracle is ``transformers``' ``Qwen2ForCausalLM`` on a tiny seeded random config (fp32): our model,
loaded from its HF checkpoint and from a GGUF written the way llama.cpp's converter writes a ``qwen2``
(no q/k row permutation: llama.cpp runs qwen2 with NEOX rotate-half RoPE), must give the same greedy tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_llama_gguf import MERGES, SPECIALS, byte_level_alphabet, prefill_logits

from omniduplex.models.cascade.chat_template import CHATML_TEMPLATE
from omniduplex.models.cascade.gguf_import import import_gguf
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.request import Request, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


def tiny_hf_qwen2(path, seed: int = 0):
    """A seeded random ``Qwen2ForCausalLM`` (untied, rope theta 1e6, non-zero biases) saved into ``path``."""
    cfg = transformers.Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a missing or misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip


def write_qwen2_gguf(path, model, arch: str = "qwen2") -> None:
    """``model`` as llama.cpp writes a qwen2 GGUF: no q/k permutation, biases as ``blk.N.attn_q.bias``."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    tokens = SPECIALS + byte_level_alphabet() + [m.replace(" ", "") for m in MERGES]
    tokens += [f"<unused{i}>" for i in range(cfg.vocab_size - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in _NAMES.items():
            w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(sd[f"model.layers.{i}.{hf}.weight"]))
            if f"model.layers.{i}.{hf}.bias" in sd:
                w.add_tensor(f"blk.{i}.{gg}.bias", sd[f"model.layers.{i}.{hf}.bias"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def engine_greedy(thinker, prompts: list[list[int]], n: int) -> list[list[int]]:
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=32, max_num_seqs=4, max_num_batched_tokens=16)
    for i, p in enumerate(prompts):
        engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=n)))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id] += o.new_token_ids
    return [got[f"r{i}"] for i in range(len(prompts))]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8], list(range(40, 70))]


def test_hf_qwen2_checkpoint_matches_transformers(tmp_path):
    ref = tiny_hf_qwen2(tmp_path, seed=3)
    ours = load_model(tmp_path, parts=("thinker",))
    assert ours.architecture == "Qwen2ForCausalLM"
    names = set(ours.thinker.state_dict())
    assert "model.layers.0.self_attn.qkv_proj.bias" in names
    assert "model.layers.0.self_attn.o_proj.bias" not in names and not any("q_norm" in n for n in names)
    with torch.no_grad():
        want = ref(torch.tensor([PROMPTS[2]])).logits[0]
    torch.testing.assert_close(prefill_logits(ours.thinker, PROMPTS[2]), want, rtol=1e-4, atol=1e-4)
    assert engine_greedy(ours.thinker, PROMPTS, 12) == [hf_greedy(ref, p, 12) for p in PROMPTS]


def test_qwen2_gguf_import_greedy_matches_transformers(tmp_path):
    ref = tiny_hf_qwen2(tmp_path / "hf", seed=7)
    src = tmp_path / "tiny-qwen2.gguf"
    write_qwen2_gguf(src, ref)
    out = import_gguf(src, tmp_path / "imported")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["rope_theta"] == 1e6
    assert cfg["tie_word_embeddings"] is False
    ours = load_model(out, parts=("thinker",))
    assert engine_greedy(ours.thinker, PROMPTS, 12) == [hf_greedy(ref, p, 12) for p in PROMPTS]
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == CHATML_TEMPLATE and tok_cfg["eos_token"] == "<|im_end|>"


def test_gguf_import_in_shards_equals_one_file(tmp_path, monkeypatch):
    """An import larger than ``SHARD_BYTES`` is written one shard at a time (with the HF index) and loads to
    the same tensors as the one-file import."""
    from omniduplex.models.cascade import gguf_import
    from omniduplex.models.checkpoint import INDEX_FILE

    ref = tiny_hf_qwen2(tmp_path / "hf", seed=8)
    src = tmp_path / "tiny-qwen2.gguf"
    write_qwen2_gguf(src, ref)
    whole = import_gguf(src, tmp_path / "whole")
    monkeypatch.setattr(gguf_import, "SHARD_BYTES", 64 * 1024)  # the tiny model's ~0.4 MB in several shards
    sharded = import_gguf(src, tmp_path / "sharded")
    shards = sorted(sharded.glob("model-*-of-*.safetensors"))
    index = json.loads((sharded / INDEX_FILE).read_text())
    assert len(shards) > 2 and not (sharded / "model.safetensors").exists()
    assert set(index["weight_map"].values()) == {f.name for f in shards}
    assert gguf_import.is_complete(sharded) and gguf_import.is_complete(whole)
    a = load_model(whole, parts=("thinker",)).thinker.state_dict()
    b = load_model(sharded, parts=("thinker",)).thinker.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qwen2_tokenizer_splits_single_digits(tmp_path):
    from tokenizers import Tokenizer

    ref = tiny_hf_qwen2(tmp_path / "hf")
    write_qwen2_gguf(tmp_path / "q.gguf", ref)
    tok = Tokenizer.from_file(str(import_gguf(tmp_path / "q.gguf", tmp_path / "out") / "tokenizer.json"))
    assert tok.encode(" the cat 123").tokens == ["Ġthe", "Ġcat", "Ġ", "1", "2", "3"]
    assert tok.decode(tok.encode("<|im_start|>hi the cat").ids, skip_special_tokens=False) == (
        "<|im_start|>hi the cat"
    )


def test_unknown_gguf_architecture_is_one_line(tmp_path):
    ref = tiny_hf_qwen2(tmp_path / "hf")
    write_qwen2_gguf(tmp_path / "phi.gguf", ref, arch="phi3")
    with pytest.raises(CheckpointError, match=r"phi\.gguf: GGUF architecture 'phi3' is not supported") as e:
        import_gguf(tmp_path / "phi.gguf", tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


# -- slow: the real Qwen2.5-Coder-0.5B-Instruct GGUF against transformers' own GGUF loading ----------------
@pytest.mark.slow
def test_real_qwen_05b_tokens_and_greedy_match_transformers(tmp_path_factory):
    from tokenizers import Tokenizer

    from omniduplex.models.cascade.chat_template import render_chat
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.weights import QWEN25_CODER_05B, WeightsError, assemble, cache_dir

    try:
        src = assemble(QWEN25_CODER_05B)
    except WeightsError as e:
        pytest.skip(str(e))
    d = cached_import(src, cache_dir() / "gguf")
    ours_tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    with pytest.MonkeyPatch.context() as mp:
        # transformers only checks for accelerate before a GGUF load; the fp32 CPU path does not use it
        mp.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, dtype=torch.float32
        ).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    chat = [{"role": "system", "content": "You are a helpful voice assistant. Answer in one short sentence."},
            {"role": "user", "content": "How many days are in 2 weeks? Café, naïve, 12345!"}]  # fmt: skip
    text = render_chat(d, chat)
    assert text == ref_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = ours_tok.encode(text).ids
    assert ids == ref_tok(text)["input_ids"]
    ours = load_model(d, parts=("thinker",))
    assert engine_greedy(ours.thinker, [ids], 16) == [hf_greedy(ref, ids, 16)]
