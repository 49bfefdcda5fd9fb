"""Our C++ CPU kernels (kernels/csrc/cpu_ops.cpp) against the plain-torch references they replace: decode
attention over the paged cache, the KV write, the MoE dispatch and packed linears; their errors; a model
prepared for CPU serving runs on them and gives the reference's logits; and the fallback when they are off
or cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from omniduplex.kernels import attention, cpu_linear, cpu_ops
from omniduplex.kernels.moe import moe_experts
from omniduplex.kernels.paged_attention_ref import paged_attention_torch, write_kv_cache

cpu_ops.load()  # the CI machine has g++ and ninja: a failed build fails every test here
OPS = torch.ops.omniduplex_cpu
NATIVE_BF16 = cpu_linear.can_pack(torch.zeros(2, 2, dtype=torch.bfloat16))
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _paged_case(seed, num_seqs, num_q_heads, num_kv_heads, head_dim, dtype, max_len=200):
    g = torch.Generator().manual_seed(seed)
    num_blocks, block_size = 64, 16
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    seq_lens = torch.randint(1, max_len, (num_seqs,), generator=g, dtype=torch.int32)
    width = -(-max_len // block_size) + 1  # wider than needed: unused entries hold garbage (-7)
    tables = torch.full((num_seqs, width), -7, dtype=torch.int32)
    for s in range(num_seqs):
        need = -(-int(seq_lens[s]) // block_size)
        tables[s, :need] = torch.randperm(num_blocks, generator=g)[:need].int()
    q = torch.randn(num_seqs, num_q_heads, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, tables, seq_lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("heads", "head_dim"), [((8, 4), 64), ((4, 4), 128), ((6, 2), 48), ((16, 2), 64), ((9, 3), 96)]
)
@pytest.mark.parametrize("num_seqs", [1, 5])
def test_decode_attention_equals_torch_reference(dtype, heads, head_dim, num_seqs):
    case = _paged_case(num_seqs + head_dim, num_seqs, *heads, head_dim, dtype)
    q, k_cache, v_cache, tables, seq_lens = case
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32)
    scale = head_dim**-0.5
    want = paged_attention_torch(q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, qsl, scale)
    got = OPS.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want, atol=TOL[dtype], rtol=TOL[dtype])


def test_dispatcher_keeps_head_sizes_the_kernel_does_not_take_on_torch(monkeypatch):
    monkeypatch.delenv(attention.BACKEND_ENV, raising=False)
    q, k_cache, v_cache, tables, seq_lens = _paged_case(5, 3, 4, 2, 40, torch.float32)
    assert not cpu_ops.fits_decode_kernel(q, k_cache)
    assert cpu_ops.fits_decode_kernel(torch.zeros(1, 4, 64), torch.zeros(2, 16, 2, 64))
    assert not cpu_ops.fits_decode_kernel(torch.zeros(1, 4, 64), torch.zeros(2, 16, 2, 64).bfloat16())
    qsl = torch.arange(4, dtype=torch.int32)
    got = attention.paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, 0.15, max_query_len=1)
    want = paged_attention_torch(q, k_cache, v_cache, tables, seq_lens, qsl, 0.15)
    torch.testing.assert_close(got, want)


def test_decode_attention_takes_strided_queries():
    q, k_cache, v_cache, tables, seq_lens = _paged_case(3, 3, 8, 4, 64, torch.float32)
    wide = torch.cat([q, torch.zeros_like(q)], dim=-1)[..., :64]  # a split of a fused QKV: not contiguous
    assert not wide.is_contiguous()
    torch.testing.assert_close(
        OPS.paged_decode_attention(wide, k_cache, v_cache, tables, seq_lens, 0.125),
        OPS.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125),
    )


def test_decode_attention_rejects_bad_tables_and_lengths():
    q, k_cache, v_cache, tables, seq_lens = _paged_case(4, 2, 8, 4, 64, torch.float32)
    bad = tables.clone()
    bad[0, 0] = 10_000
    with pytest.raises(RuntimeError, match="holds block 10000"):
        OPS.paged_decode_attention(q, k_cache, v_cache, bad, seq_lens, 0.125)
    too_long = torch.tensor([tables.shape[1] * 16 + 1, 3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="outside"):
        OPS.paged_decode_attention(q, k_cache, v_cache, tables, too_long, 0.125)
    with pytest.raises(RuntimeError, match="int32"):
        OPS.paged_decode_attention(q, k_cache, v_cache, tables.long(), seq_lens, 0.125)
    with pytest.raises(RuntimeError, match="dtype"):
        OPS.paged_decode_attention(q.bfloat16(), k_cache, v_cache, tables, seq_lens, 0.125)


def test_dispatcher_takes_the_cpp_kernel_for_cpu_decode_only(monkeypatch):
    monkeypatch.delenv(attention.BACKEND_ENV, raising=False)
    assert attention.select_backend(torch.device("cpu"), decode_only=True) == "cpp"
    assert attention.select_backend(torch.device("cpu"), decode_only=False) == "torch"
    monkeypatch.setenv(attention.BACKEND_ENV, "torch")
    assert attention.select_backend(torch.device("cpu"), decode_only=True) == "torch"
    monkeypatch.setenv(attention.BACKEND_ENV, "cpp")
    assert attention.select_backend(torch.device("cpu"), decode_only=True) == "cpp"
    with pytest.raises(RuntimeError, match="CPU"):
        attention.select_backend(torch.device("cuda"), decode_only=True)
    monkeypatch.setenv(cpu_ops.ENV, "0")
    monkeypatch.setenv(attention.BACKEND_ENV, "auto")
    assert attention.select_backend(torch.device("cpu"), decode_only=True) == "torch"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_write_equals_reference_and_rejects_bad_slots_untouched(dtype):
    g = torch.Generator().manual_seed(0)
    want_k, want_v = torch.zeros(8, 16, 2, 32, dtype=dtype), torch.zeros(8, 16, 2, 32, dtype=dtype)
    got_k, got_v = want_k.clone(), want_v.clone()
    k, v = torch.randn(5, 2, 32, generator=g), torch.randn(5, 2, 32, generator=g)  # fp32: cast to the cache
    slots = torch.tensor([3, 17, 40, 127, 64], dtype=torch.int32)
    write_kv_cache(want_k, want_v, k, v, slots)
    OPS.write_kv_cache(got_k, got_v, k, v, slots)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    before = got_k.clone()
    with pytest.raises(RuntimeError, match="slot_mapping\\[1\\] = 128"):
        OPS.write_kv_cache(got_k, got_v, k[:2], v[:2], torch.tensor([0, 128]))
    assert torch.equal(got_k, before)  # the valid first row was not written either


def _experts(dtype, tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    e, h, i, k = 8, 64, 48, 2
    gate_up = (torch.randn(e, 2 * i, h, generator=g) * 0.1).to(dtype)
    down = (torch.randn(e, h, i, generator=g) * 0.1).to(dtype)
    x = torch.randn(tokens, h, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, k, generator=g), -1).to(dtype)
    return x, gate_up, down, weights, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 2, 13, 64])
def test_moe_experts_equals_python_dispatch(dtype, tokens):
    x, gate_up, down, weights, ids = _experts(dtype, tokens, seed=tokens)
    want = moe_experts(x.float(), gate_up.float(), down.float(), weights.float(), ids)
    got = OPS.moe_experts(x, gate_up, down, weights, ids, -1)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=TOL[dtype] * 2, rtol=TOL[dtype] * 2)
    if dtype == torch.bfloat16 and NATIVE_BF16:
        keys = [cpu_linear.register(cpu_linear.pack(w)) for w in [*gate_up, *down]]
        assert keys == list(range(keys[0], keys[0] + 16))
        packed = OPS.moe_experts(x, gate_up, down, weights, ids, keys[0])
        torch.testing.assert_close(packed.float(), want, atol=4e-2, rtol=4e-2)


def test_moe_experts_rejects_bad_ids_and_shapes():
    x, gate_up, down, weights, ids = _experts(torch.float32, 3)
    with pytest.raises(RuntimeError, match="expert id 8"):
        OPS.moe_experts(x, gate_up, down, weights, torch.full_like(ids, 8), -1)
    with pytest.raises(RuntimeError, match="shapes"):
        OPS.moe_experts(x, gate_up, down[:, :, :10], weights, ids, -1)
    with pytest.raises(RuntimeError, match="no packed weight"):
        OPS.moe_experts(x.bfloat16(), gate_up.bfloat16(), down.bfloat16(), weights.bfloat16(), ids, 10**6)


def test_prepared_model_runs_on_the_cpp_kernels_with_reference_outputs(tmp_path):
    """A model prepared for CPU serving (``prepack_linears``) switches its layers onto the C++ ops, and its
    prefill + decode hidden states match the same model on the plain-torch paths."""
    from omniduplex.models.qwen3_omni.presets import write_checkpoint
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    d = write_checkpoint(tmp_path / "m", "tiny", seed=3, text_only=True)

    def logits(prepare: bool) -> torch.Tensor:
        thinker = load_model(d).thinker
        if prepare:
            cpu_linear.prepack_linears(thinker)
        attn = thinker.model.layers[0].self_attn
        assert attn.use_cpu_ops is prepare
        engine = Engine(DecoderLMAdapter(thinker), num_blocks=32, max_num_seqs=4)
        rows = []
        real_sample = engine._sample

        def keep(reqs, hidden):  # the final hidden states the step samples from
            rows.append(hidden.float().clone())
            return real_sample(reqs, hidden)

        engine._sample = keep
        with torch.inference_mode():
            for i, p in enumerate([[5, 6, 7, 8, 9], [11, 3], [200, 1, 4]]):
                engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=6)))
            while engine.has_unfinished():
                engine.step()
        return torch.cat(rows)

    torch.testing.assert_close(logits(True), logits(False), atol=1e-4, rtol=1e-4)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


CHECK_FALLBACK = """
    import torch
    from omniduplex.kernels import attention, cpu_linear, cpu_ops
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert cpu_ops.attach(model) is False and not cpu_ops.loaded()
    assert attention.select_backend(torch.device("cpu"), decode_only=True) == "torch"
    print("FALLBACK OK")
"""


def test_off_switch_keeps_the_torch_paths():
    proc = _run(CHECK_FALLBACK, OMNIDUPLEX_CPU_OPS="0")
    assert "FALLBACK OK" in proc.stdout, proc.stderr[-2000:]


def test_build_failure_falls_back_with_the_reason_logged(tmp_path):
    proc = _run(CHECK_FALLBACK, CXX="/nonexistent/g++", TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert "FALLBACK OK" in proc.stdout, proc.stderr[-2000:]
    assert "C++ CPU kernels unavailable" in proc.stderr


BUILD_AND_RUN = """
    import torch
    from omniduplex.kernels import cpu_ops
    cpu_ops.load()
    k = torch.zeros(2, 16, 1, 16)
    torch.ops.omniduplex_cpu.write_kv_cache(k, k.clone(), torch.ones(1, 1, 16), torch.ones(1, 1, 16),
                                            torch.tensor([3]))
    assert k.view(-1, 16)[3].sum() == 16
    print("BUILT OK")
"""


@pytest.mark.slow  # a cold build of the extension (~15 s on two cores)
def test_cold_build_by_processes_starting_together_and_a_stale_torch_lock(tmp_path):
    """Stage processes start together on a fresh machine: one builds, the other waits, both load. A lock
    file left by a build killed midway (torch's, which torch never clears) does not make them wait forever."""
    build_dir = tmp_path / f"omniduplex_cpu_ops_{cpu_ops._build_tag()}"
    build_dir.mkdir()
    (build_dir / "lock").write_text("")  # what a killed build leaves
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(BUILD_AND_RUN)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert "BUILT OK" in out, err[-2000:]
    assert list(build_dir.glob("*.so"))


# -- decoder-layer glue: RMSNorm, RoPE, SiLU·up ------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_glue_ops_match_the_torch_path(dtype):
    import torch.nn.functional as F

    from omniduplex.models.layers import RMSNorm, RotaryEmbedding, apply_rotary

    g = torch.Generator().manual_seed(5)
    norm = RMSNorm(576, eps=1e-5).to(dtype)
    norm.weight.data = torch.randn(576, generator=g).to(dtype)
    x, d = (torch.randn(3, 576, generator=g).to(dtype) for _ in range(2))
    # the sum of squares in another order: within an ulp of the module (fp32: 1e-6; bf16: a rounding that a
    # 1-ulp fp32 difference may flip: two bf16 ulps after the weight product)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=2**-6, atol=0.0)
    torch.testing.assert_close(OPS.rms_norm(x, norm.weight, norm.eps), norm(x), **tol)
    total, normed = OPS.add_rms_norm(x, d, norm.weight, norm.eps)
    assert torch.equal(total, x + d)
    torch.testing.assert_close(normed, norm(x + d), **tol)
    # RoPE in place on views of one qkv row block, bit-equal to the rotate-half path
    qkv = torch.randn(3, 9 * 64, generator=g).to(dtype)
    q, k, _ = qkv.split((5 * 64, 2 * 64, 2 * 64), dim=-1)
    q, k = q.reshape(3, 5, 64), k.reshape(3, 2, 64)
    rope = RotaryEmbedding(64, 1e6)(torch.tensor([0, 7, 1000]))
    want_q, want_k = apply_rotary(q, *rope), apply_rotary(k, *rope)
    OPS.rotary_(q, k, *rope)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(qkv[:, : 5 * 64].reshape(3, 5, 64), want_q)  # written through the views
    for width in (1536, 100, 7):  # whole vectors and a scalar tail
        gu = torch.randn(2, 2 * width, generator=g).to(dtype) * 4
        assert torch.equal(OPS.silu_and_mul(gu), F.silu(gu[:, :width]) * gu[:, width:])


def test_layer_glue_ops_reject_bad_shapes():
    with pytest.raises(RuntimeError, match="rms_norm: weight"):
        OPS.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="rotary_: cos/sin"):
        OPS.rotary_(torch.randn(2, 1, 8), torch.randn(2, 1, 8), torch.ones(3, 8), torch.zeros(3, 8))
    with pytest.raises(RuntimeError, match="silu_and_mul: odd"):
        OPS.silu_and_mul(torch.randn(2, 7))
