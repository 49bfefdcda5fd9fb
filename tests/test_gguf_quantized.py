"""A GGUF LLM served on its quantized blocks (``models/cascade/gguf_quantized.py`` + our C++ kernels).

Fast tests write tiny GGUFs whose matmul weights are GGML-quantised (``gguf.quants.quantize``) and compare
the quantized model with the same GGUF's dequantised fp32 import: prefill logits within 3% of their spread
(relative Frobenius error, from the per-32 int8 rounding of activations; measured ~0.5-1%). The slow test
runs the real Qwen2.5-Coder-0.5B Q4_K_M GGUF, teacher-forced on the dequantised fp32 run's 32 greedy reply
tokens: the quantized argmax equals fp32's wherever fp32's two best tokens are more than 0.25 logits apart.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_llama_gguf import prefill_logits, tiny_hf_llama, write_tiny_gguf
from test_qwen2_gguf import engine_greedy, tiny_hf_qwen2, write_qwen2_gguf

from omniduplex.models.cascade.gguf_import import import_gguf
from omniduplex.models.cascade.gguf_quantized import QuantEmbedding, QuantLinear, load_quantized
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.registry import load_model

gguf = pytest.importorskip("gguf")


def requantize(src, dst, kinds: dict[str, str]) -> None:
    """Copy GGUF ``src`` to ``dst`` with the 2-D tensors whose name contains a key of ``kinds`` quantised
    to that GGML type (``gguf.quants.quantize``)."""
    r = gguf.GGUFReader(str(src))
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vt)
    for t in r.tensors:
        arr = np.array(t.data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape.tolist())])
        kind = next((k for key, k in kinds.items() if key in t.name and arr.ndim == 2), None)
        if kind is None:
            w.add_tensor(t.name, arr)
        else:
            qt = getattr(gguf.GGMLQuantizationType, kind)
            w.add_tensor(t.name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


QWEN2_KINDS = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_1", "ffn": "Q5_0",
               "output.": "Q8_0", "token_embd": "Q8_0"}  # fmt: skip


def test_quantized_qwen2_matches_its_dequantized_import(tmp_path):
    ref = tiny_hf_qwen2(tmp_path / "hf", seed=11)
    write_qwen2_gguf(tmp_path / "f32.gguf", ref)
    src = tmp_path / "q.gguf"
    requantize(tmp_path / "f32.gguf", src, QWEN2_KINDS)
    deq = load_model(import_gguf(src, tmp_path / "imported"), parts=("thinker",))
    ids = list(range(40, 70))
    want = prefill_logits(deq.thinker, ids)
    model = load_quantized(tmp_path / "imported", src)  # built on meta: no float copy of the projections
    kinds = [m.types for m in model.thinker.modules() if isinstance(m, QuantLinear)]
    # per layer: qkv = Q5_0 (q, k) + Q8_0 (v), o Q4_1, gate_up Q5_0, down Q5_0; plus lm_head Q8_0
    assert sorted(kinds) == sorted([(6, 8), (3,), (6,), (6,)] * 2 + [(8,)])
    assert not any(t.is_meta for t in [*model.thinker.parameters(), *model.thinker.buffers()])
    rope = model.thinker.model.rotary.inv_freq
    assert torch.equal(rope, deq.thinker.model.rotary.inv_freq)
    norms = [n for n, p in deq.thinker.named_parameters() if n.endswith("norm.weight")]
    assert norms
    assert all(torch.equal(model.thinker.get_parameter(n), deq.thinker.get_parameter(n)) for n in norms)
    attn = model.thinker.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj, QuantLinear) and attn.qkv_proj.types == (6, 8)
    assert attn.qkv_proj.bias is not None  # Qwen2's q/k/v biases kept
    assert isinstance(model.thinker.model.embed_tokens, QuantEmbedding)
    assert not any(p.numel() > 300 for p in model.thinker.parameters())  # no float matmul weights left
    got = prefill_logits(model.thinker, ids)
    assert rel(got, want) < 0.03
    # embedding rows are dequantised exactly
    e = torch.tensor([0, 5, 299])
    assert torch.equal(model.thinker.model.embed_tokens(e), deq.thinker.model.embed_tokens(e))
    assert len(engine_greedy(model.thinker, [ids[:7], ids], 6)[1]) == 6


def test_quantized_llama_unpermutes_q_k_rows(tmp_path):
    ref = tiny_hf_llama(tmp_path / "hf", tie=True, seed=12)
    write_tiny_gguf(tmp_path / "f32.gguf", ref)
    src = tmp_path / "q.gguf"
    requantize(tmp_path / "f32.gguf", src, {"blk.": "Q8_0", "token_embd": "Q4_1"})
    deq = load_model(import_gguf(src, tmp_path / "imported"), parts=("thinker",))
    model = load_quantized(tmp_path / "imported", src)  # tied: the LM head from token_embd
    ids = [5, 17, 250, 3, 99, 42, 7, 7, 128, 64]
    assert rel(prefill_logits(model.thinker, ids), prefill_logits(deq.thinker, ids)) < 0.03


def test_unsupported_quant_type_is_one_line(tmp_path):
    ref = tiny_hf_qwen2(tmp_path / "hf", seed=13)
    write_qwen2_gguf(tmp_path / "f32.gguf", ref)
    src = tmp_path / "q40.gguf"
    requantize(tmp_path / "f32.gguf", src, {"ffn_up": "Q4_0"})
    imported = import_gguf(src, tmp_path / "imported")
    with pytest.raises(
        CheckpointError, match=r"q40\.gguf: tensor blk\.0\.ffn_up\.weight has quant type Q4_0"
    ) as e:
        load_quantized(imported, src)
    assert "\n" not in str(e.value)


def test_truncated_gguf_is_one_line(tmp_path):
    ref = tiny_hf_qwen2(tmp_path / "hf", seed=14)
    write_qwen2_gguf(tmp_path / "whole.gguf", ref)
    data = (tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.gguf: not a readable GGUF") as e:
        import_gguf(tmp_path / "cut.gguf", tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


# -- slow: the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M ----------------------------------------------------
@pytest.mark.slow
def test_real_qwen_05b_quantized_greedy_equals_dequantized(tmp_path_factory):
    from tokenizers import Tokenizer

    from omniduplex.models.cascade.chat_template import render_chat
    from omniduplex.models.cascade.gguf_import import cached_import
    from omniduplex.models.weights import QWEN25_CODER_05B, WeightsError, assemble, cache_dir

    try:
        src = assemble(QWEN25_CODER_05B)
    except WeightsError as e:
        pytest.skip(str(e))
    d = cached_import(src, cache_dir() / "gguf")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    chats = [
        [{"role": "system", "content": "You are a helpful voice assistant. Answer in one short sentence."},
         {"role": "user", "content": "What is the capital of France?"}],
        [{"role": "user", "content": "Name three colours of the rainbow."}],
    ]  # fmt: skip
    prompts = [tok.encode(render_chat(d, c)).ids for c in chats]
    model = load_model(d, parts=("thinker",))
    want = engine_greedy(model.thinker, prompts, 32)
    assert "Paris" in tok.decode(want[0])
    seqs = [p + w for p, w in zip(prompts, want)]
    spans = [slice(len(p) - 1, len(s) - 1) for p, s in zip(prompts, seqs)]  # logits of the 32 replies
    ref = torch.cat([prefill_logits(model.thinker, s)[sp] for s, sp in zip(seqs, spans)])
    model = load_quantized(d, src)
    got = torch.cat([prefill_logits(model.thinker, s)[sp] for s, sp in zip(seqs, spans)])
    # The int8 activation rounding moves logits by ~0.05 (mean |difference| 0.045 measured on these
    # sequences), so positions where fp32's two best tokens are closer than TIE logits are near-ties that
    # either kernel summation order may flip (llama.cpp's own margin at one of them is 0.007). Teacher-forced
    # on the fp32 replies: the quantized argmax equals fp32's at every other position, and those are ≥ 90%.
    tie = 0.25
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > tie
    assert decided.float().mean().item() >= 0.9
    assert torch.equal(got.argmax(-1)[decided], ref.argmax(-1)[decided])


def test_manifest_llm_quantized_option(tmp_path):
    from omniduplex.models.cascade.manifest import load_manifest, write_manifest

    for name in ("asr", "voice.onnx", "voice.onnx.json", "m.gguf"):
        (tmp_path / name).mkdir() if name == "asr" else (tmp_path / name).write_bytes(b"x")
    parts = dict(asr=tmp_path / "asr", tts=tmp_path / "voice.onnx")
    gg = tmp_path / "m.gguf"
    assert not load_manifest(write_manifest(tmp_path / "a.yaml", llm=gg, **parts)).llm_quantized
    m = load_manifest(write_manifest(tmp_path / "b.yaml", llm=gg, llm_quantized=True, **parts))
    assert m.llm_quantized
    write_manifest(tmp_path / "c.yaml", llm=tmp_path / "asr", llm_quantized=True, **parts)
    with pytest.raises(CheckpointError, match="llm_quantized needs a .gguf llm"):
        load_manifest(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text((tmp_path / "b.yaml").read_text().replace("true", "'yes'"))
    with pytest.raises(CheckpointError, match="llm_quantized must be true or false"):
        load_manifest(tmp_path / "d.yaml")


def test_decode_step_in_one_call_equals_the_per_op_path(tmp_path):
    """A registered layer's decode (``quant_decode_layer``: norms, two-type qkv with Qwen2's biases, RoPE, KV
    write, attention, MLP in one C++ call) gives bit-identical logits and KV cache to the per-op path on the
    same C++ kernels, for a batch of sequences of different lengths."""
    from omniduplex.kernels import cpu_ops
    from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache

    ref = tiny_hf_qwen2(tmp_path / "hf", seed=15)
    write_qwen2_gguf(tmp_path / "f32.gguf", ref)
    src = tmp_path / "q.gguf"
    requantize(tmp_path / "f32.gguf", src, QWEN2_KINDS)
    th = load_quantized(import_gguf(src, tmp_path / "imported"), src).thinker
    layers = th.model.layers
    assert all(layer.quant_key >= 0 for layer in layers)
    assert cpu_ops.attach(th)  # the per-op path then runs the same C++ norms, RoPE and attention
    cfg = th.cfg
    kv = allocate_kv_cache(cfg.num_hidden_layers, 8, cfg.num_key_value_heads, cfg.head_dim)
    lens = [9, 20, 16]
    prompt = torch.arange(sum(lens)) % 250 + 3
    th(th.embed(prompt), ForwardBatch.contiguous(lens, [0, 0, 0]), kv)
    step = ForwardBatch.contiguous([1, 1, 1], lens)
    x = th.embed(torch.tensor([7, 101, 42]))

    def decode(fused: bool):
        cache = [(k.clone(), v.clone()) for k, v in kv]
        keys = [layer.quant_key for layer in layers]
        if not fused:
            for layer in layers:
                layer.quant_key = -1
        try:
            hidden, _ = th(x, step, cache)
        finally:
            for layer, key in zip(layers, keys):
                layer.quant_key = key
        return th.compute_logits(hidden), cache

    fused, fused_cache = decode(True)
    per_op, per_op_cache = decode(False)
    assert torch.equal(fused, per_op)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(fused_cache, per_op_cache))
    assert not torch.equal(fused_cache[0][0], kv[0][0])  # this step's K was written
