"""The fused Triton element-wise kernels (kernels/triton_ops.py) against the torch code of models/layers.py
they replace, and a decoder with them attached against the same decoder without.

On CPU they run under the Triton interpreter (``TRITON_INTERPRET=1``, set by tests/conftest.py before triton
is imported). Expected precision: fp16 within one ulp and mostly bit-equal (the kernels round where the torch
code rounds, the interpreter converts to fp16 with round-to-nearest-even like the GPU; ``exp`` and the order
of a sum of squares differ); fp32 within a few ulp; bf16 within one bf16 rounding (the interpreter converts
fp32 to bf16 by truncation, the GPU by round-to-nearest-even, so the CPU run cannot be closer there).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from omniduplex.models.config import DecoderConfig  # noqa: E402
from omniduplex.models.forward_batch import ForwardBatch, allocate_kv_cache  # noqa: E402
from omniduplex.models.layers import DecoderStack, RMSNorm, RotaryEmbedding, apply_rotary  # noqa: E402

triton_ops = pytest.importorskip("omniduplex.kernels.triton_ops")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _needs_triton():
    pytest.importorskip("triton")
    if DEVICE == "cpu" and not INTERPRET:
        pytest.skip("TRITON_INTERPRET is not 1 and there is no CUDA device")


def assert_like_torch(got: torch.Tensor, want: torch.Tensor) -> None:
    """The precision contract of the module docstring."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float16:
        torch.testing.assert_close(got.float(), want.float(), atol=2e-3, rtol=2e-3)
        if DEVICE == "cpu":  # the interpreter rounds as torch's CPU code does; CUDA's fp16 ops fuse (H200:
            assert (got != want).float().mean() < 0.02  # 16% of RoPE outputs one ulp apart, all within 2e-3)
    elif got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:  # one rounding of the dtype, relative to the magnitude
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1.6e-2)


def _norm_module(h: int, dtype: torch.dtype, gen: torch.Generator) -> RMSNorm:
    norm = RMSNorm(h, eps=1e-5).to(DEVICE)
    norm.weight.data = (1 + 0.5 * torch.randn(h, generator=gen)).to(DEVICE)
    return norm.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_residual_add_match_the_module(dtype):
    gen = torch.Generator().manual_seed(1)
    norm = _norm_module(200, dtype, gen)  # not a power of two: masked tail
    wide = (3 * torch.randn(5, 300, generator=gen)).to(dtype).to(DEVICE)
    x = wide[:, :200]  # strided rows
    delta = torch.randn(5, 200, generator=gen).to(dtype).to(DEVICE)
    assert_like_torch(triton_ops.rms_norm(x, norm.weight, norm.eps), norm(x))
    res, normed = triton_ops.add_rms_norm(x, delta, norm.weight, norm.eps)
    if dtype != torch.bfloat16 or DEVICE == "cuda":
        assert torch.equal(res, x + delta)
    assert_like_torch(res, x + delta)
    assert_like_torch(normed, norm(x + delta))
    x3 = x.reshape(5, 1, 200).expand(5, 2, 200)  # N-D input
    assert_like_torch(triton_ops.rms_norm(x3, norm.weight, norm.eps), norm(x3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [True, False])
def test_rotary_in_place_matches_norm_then_apply_rotary(dtype, qk_norm):
    """q and k as views of one fused qkv row (the Attention layer's layout): rotated in place, v untouched."""
    gen = torch.Generator().manual_seed(2 + qk_norm)
    t, hq, hkv, d = 4, 6, 2, 32
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype).to(DEVICE)
    before = qkv.clone()
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    cos, sin = RotaryEmbedding(d, 10_000.0).to(DEVICE)(torch.tensor([0, 3, 77, 4000], device=DEVICE))
    q_norm, k_norm = _norm_module(d, dtype, gen), _norm_module(d, dtype, gen)
    want_q, want_k = (q_norm(q), k_norm(k)) if qk_norm else (q, k)
    want_q, want_k = apply_rotary(want_q, cos, sin), apply_rotary(want_k, cos, sin)
    norms = (q_norm.weight, k_norm.weight, q_norm.eps) if qk_norm else ()
    assert triton_ops.rotary_(q, k, cos, sin, *norms) is None
    assert_like_torch(q, want_q)
    assert_like_torch(k, want_k)
    assert torch.equal(qkv[:, (hq + hkv) * d :], before[:, (hq + hkv) * d :])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_silu_times_up(dtype):
    gen = torch.Generator().manual_seed(3)
    for shape in [(3, 2 * 1500), (2, 1, 2 * 40)]:  # two programs per row + a tail; an N-D input
        x = (4 * torch.randn(*shape, generator=gen)).to(dtype).to(DEVICE)
        gate, up = x.chunk(2, dim=-1)
        assert_like_torch(triton_ops.silu_and_mul(x), F.silu(gate) * up)


def test_empty_batches_and_bad_inputs():
    w = torch.ones(8, device=DEVICE)
    assert triton_ops.rms_norm(torch.empty(0, 8, device=DEVICE), w, 1e-6).shape == (0, 8)
    assert triton_ops.silu_and_mul(torch.empty(0, 8, device=DEVICE)).shape == (0, 4)
    with pytest.raises(ValueError, match="weight"):
        triton_ops.rms_norm(torch.ones(2, 8, device=DEVICE), w.half(), 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        triton_ops.rms_norm(torch.ones(8, 2, device=DEVICE).t(), w, 1e-6)
    with pytest.raises(ValueError, match="delta"):
        triton_ops.add_rms_norm(torch.ones(2, 8, device=DEVICE), torch.ones(3, 8, device=DEVICE), w, 1e-6)
    with pytest.raises(ValueError, match="2I"):
        triton_ops.silu_and_mul(torch.ones(2, 7, device=DEVICE))
    q, k, cs = torch.ones(2, 4, 8), torch.ones(2, 2, 8), torch.ones(2, 8)
    with pytest.raises(ValueError, match="cos"):
        triton_ops.rotary_(q, k, cs[:1], cs)
    with pytest.raises(ValueError, match="q_weight"):
        triton_ops.rotary_(q, k, cs, cs, torch.ones(8), None)


def _decoder(qk_norm: bool, dtype: torch.dtype) -> DecoderStack:
    cfg = DecoderConfig(
        vocab_size=16,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        head_dim=16,
        qk_norm=qk_norm,
    )
    model = DecoderStack(cfg)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(
                1 + 0.2 * torch.randn(p.shape, generator=gen)
                if "norm" in name
                else torch.randn(p.shape, generator=gen) * 0.1
            )
    return model.to(device=DEVICE, dtype=dtype).eval()


@pytest.mark.parametrize(("qk_norm", "dtype"), [(True, torch.float32), (False, torch.float16)])
def test_attached_decoder_matches_the_torch_path(qk_norm, dtype, monkeypatch):
    """Prefill of two sequences then two decode steps: every layer's glue on the Triton kernels gives the
    torch path's hidden states (the attention backend is the same in both runs)."""
    monkeypatch.setenv("OMNIDUPLEX_ATTENTION_BACKEND", "torch")
    model = _decoder(qk_norm, dtype)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randn(7, 64, generator=gen).to(dtype).to(DEVICE)
    steps = [torch.randn(2, 64, generator=gen).to(dtype).to(DEVICE) for _ in range(2)]

    def run(attached: bool) -> list[torch.Tensor]:
        assert triton_ops.attach(model, enable=attached) is attached
        assert model.layers[1].mlp.use_triton_ops is attached and model.norm.use_triton_ops is attached
        kv = allocate_kv_cache(2, 8, 2, 16, dtype=dtype, device=DEVICE)
        outs = [model(prompt, ForwardBatch.contiguous([4, 3], [0, 0], device=DEVICE), kv)[0]]
        for i, x in enumerate(steps):
            outs.append(model(x, ForwardBatch.contiguous([1, 1], [4 + i, 3 + i], device=DEVICE), kv)[0])
        return outs

    with torch.inference_mode():
        want, got = run(False), run(True)
    for g, w in zip(got, want):
        torch.testing.assert_close(
            g.float(), w.float(), atol=5e-3 if dtype == torch.float16 else 1e-5, rtol=1e-3
        )


def test_attach_defaults_to_cuda_models_only(monkeypatch):
    model = _decoder(True, torch.float32)
    assert triton_ops.attach(model) is (DEVICE == "cuda")
    monkeypatch.setenv(triton_ops.ENV, "0")
    assert triton_ops.attach(model) is False
    assert not model.layers[0].self_attn.use_triton_ops
