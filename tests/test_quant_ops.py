"""Our quantized GGUF matmul kernels (``kernels/csrc/quant_ops.cpp``) against the ``gguf`` package.

Dequantisation must equal ``gguf.quants.dequantize`` bit for bit. The matmul quantises activations to int8
per 32 values (scale amax/127, round half to even), so it is compared (a) with an emulation of exactly that
rounding in float64: relative error ≤ 1e-5 (only the fp32 summation order differs), and (b) with the fp32
product of the dequantised weights: relative Frobenius error ≤ 1.5e-2 (the activation rounding; measured
~0.5e-2 on these random inputs).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from omniduplex.kernels import quant

gguf = pytest.importorskip("gguf")

# byte offsets of the fp16 fields inside one block, per type
_F16_FIELDS = {"Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_blocks(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random uint8 ``[n, row_bytes]`` rows of GGML type ``name`` with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    qtype = quant.TYPES[name]
    values, nbytes = quant.BLOCKS[qtype]
    blocks = rng.integers(0, 256, size=(n * k // values, nbytes), dtype=np.uint8)
    for off in _F16_FIELDS[name]:
        scale = (rng.standard_normal(blocks.shape[0]) * 0.02).astype(np.float16)
        blocks[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n, -1)


def gguf_dequant(name: str, blocks: np.ndarray, k: int) -> torch.Tensor:
    qt = getattr(gguf.GGMLQuantizationType, name)
    return torch.from_numpy(gguf.quants.dequantize(blocks, qt).astype(np.float32).reshape(blocks.shape[0], k))


def emulated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to int8 per 32 values as the kernel does, times ``w.T``, in float64."""
    t, k = x.shape
    xb = x.reshape(t, k // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    codes = torch.round(xb * inv)
    xq = (codes.double() * (amax.double() / 127.0).float().double()).reshape(t, k)
    return xq @ w.double().T


FORMATS = [("Q4_1", 96), ("Q5_0", 96), ("Q8_0", 96), ("Q4_K", 512), ("Q6_K", 512)]


@pytest.mark.parametrize("name,k", FORMATS)
def test_dequantize_rows_equals_gguf(name, k):
    blocks = random_blocks(name, 37, k, seed=1)
    want = gguf_dequant(name, blocks, k)
    ids = torch.tensor([0, 36, 5, 5, 17])
    got = quant.dequantize_rows(torch.from_numpy(blocks), quant.TYPES[name], k, ids)
    assert torch.equal(got, want[ids])
    allrows = quant.dequantize_rows(torch.from_numpy(blocks), quant.TYPES[name], k, torch.arange(37))
    assert torch.equal(allrows, want)


@pytest.mark.parametrize("name,k", FORMATS)
@pytest.mark.parametrize("t", [1, 3, 8, 11, 21])
def test_qmatmul_matches_dequantized_product(name, k, t):
    blocks = random_blocks(name, 45, k, seed=2)
    w = gguf_dequant(name, blocks, k)
    torch.manual_seed(t)
    x = torch.randn(t, k)
    x[0, :32] = 0  # an all-zero chunk (scale 0)
    y = quant.qmatmul(x, torch.from_numpy(blocks), quant.TYPES[name], k)
    assert y.shape == (t, 45) and y.dtype == torch.float32
    ref = emulated(x, w)
    assert ((y.double() - ref).norm() / ref.norm()).item() <= 1e-5
    exact = x.double() @ w.double().T
    assert ((y.double() - exact).norm() / exact.norm()).item() <= 1.5e-2
    # the batch is the per-row result: one pass over the weights serves every row unchanged
    rows = torch.cat(
        [quant.qmatmul(x[i : i + 1], torch.from_numpy(blocks), quant.TYPES[name], k) for i in range(t)]
    )
    assert torch.equal(y, rows)


# K with chunk counts on either side of the kernel's 8-chunk lanes, and N past one 16-row tile and
# two threads' split (the AVX2 path batches 8 activation rows per pass; a last group of 4..7 is padded,
# 1..3 go one by one)
TAILS = [("Q5_0", 320), ("Q8_0", 288), ("Q4_1", 544), ("Q4_K", 768), ("Q6_K", 1280), ("Q5_0", 896)]


@pytest.mark.parametrize("name,k", TAILS)
def test_batched_path_equals_single_rows_on_tails(name, k):
    torch.set_num_threads(2)
    n = 301
    blocks = torch.from_numpy(random_blocks(name, n, k, seed=4))
    w = gguf_dequant(name, blocks.numpy(), k)
    torch.manual_seed(k)
    x = torch.randn(19, k) * torch.logspace(-3, 2, 19).unsqueeze(1)  # rows of very different magnitude
    qt = quant.TYPES[name]
    singles = torch.cat([quant.qmatmul(x[i : i + 1], blocks, qt, k) for i in range(19)])
    ref = emulated(x, w)
    rel = ((singles.double() - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
    assert rel <= 1e-5
    for t in (2, 4, 7, 8, 9, 12, 16, 19):  # padded groups, whole groups, and 1..3 rows left over
        y = quant.qmatmul(x[:t], blocks, qt, k)
        assert torch.equal(y, singles[:t]), t
    # a sub-range of the weight rows (a different split over tiles and threads) gives the same numbers
    assert torch.equal(quant.qmatmul(x[:9], blocks[5:250].contiguous(), qt, k), singles[:9, 5:250])


def test_bf16_input_and_empty_batch():
    blocks = torch.from_numpy(random_blocks("Q8_0", 8, 64))
    x = torch.randn(2, 64)
    assert torch.equal(
        quant.qmatmul(x.bfloat16(), blocks, 8, 64), quant.qmatmul(x.bfloat16().float(), blocks, 8, 64)
    )
    assert quant.qmatmul(torch.empty(0, 64), blocks, 8, 64).shape == (0, 8)


def test_bad_shapes_and_types_raise():
    blocks = torch.from_numpy(random_blocks("Q8_0", 4, 64))
    with pytest.raises(RuntimeError, match="unsupported GGML quant type id 2"):
        quant.qmatmul(torch.randn(1, 64), blocks, 2, 64)
    with pytest.raises(RuntimeError, match="weight rows hold 68 bytes"):
        quant.qmatmul(torch.randn(1, 64), blocks, 6, 64)
    with pytest.raises(RuntimeError, match="x must be"):
        quant.qmatmul(torch.randn(1, 32), blocks, 8, 64)
    with pytest.raises(RuntimeError, match="outside"):
        quant.dequantize_rows(blocks, 8, 64, torch.tensor([4]))
    with pytest.raises(ValueError, match="not supported"):
        quant.row_bytes(2, 64)


@pytest.mark.slow
def test_scalar_fallback_agrees_with_the_vector_path(tmp_path):
    """The portable path, built apart (``OMNIDUPLEX_QUANT_ISA=scalar``), gives the same dequantisation and
    a matmul within fp32 summation-order error of the vector path's."""
    cases = []
    for name, k in FORMATS:
        blocks = random_blocks(name, 19, k, seed=3)
        x = torch.randn(5, k)
        cases.append((name, k, blocks, x))
    torch.save([(n, k, torch.from_numpy(b), x) for n, k, b, x in cases], tmp_path / "cases.pt")
    script = (
        "import sys, torch\n"
        "from omniduplex.kernels import quant\n"
        "assert quant.isa() == 'scalar', quant.isa()\n"
        "out = []\n"
        "for n, k, b, x in torch.load(sys.argv[1]):\n"
        "    out.append((quant.qmatmul(x, b, quant.TYPES[n], k),\n"
        "                quant.dequantize_rows(b, quant.TYPES[n], k, torch.arange(b.shape[0]))))\n"
        "torch.save(out, sys.argv[2])\n"
    )
    env = {**os.environ, quant.ISA_ENV: "scalar"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
                   env=env, check=True, timeout=600)  # fmt: skip
    for (name, k, blocks, x), (y, deq) in zip(cases, torch.load(tmp_path / "out.pt")):
        assert torch.equal(deq, gguf_dequant(name, blocks, k)), name
        y_vec = quant.qmatmul(x, torch.from_numpy(blocks), quant.TYPES[name], k)
        torch.testing.assert_close(y, y_vec, rtol=1e-5, atol=1e-5)


# The AVX2 tiles: 4 weight rows x 1..4 activation rows (T <= 4), a buffer of 4 unpacked rows that every
# activation row passes 4 (Q8_0: 8) at a time (T > 4), 8 weight rows for T = 1 (Q8_0: 2 x 1..4 and 1 x 8).
# N = 1..3 and 4k+1..4k+3 leave padded row groups; T values leave 1..3 (and 5..7) activation rows over.
TILE_N = [1, 2, 3, 5, 6, 7, 13, 30]
TILE_T = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 17]


@pytest.mark.parametrize("name,k", FORMATS)
def test_tiles_equal_single_rows_for_every_t_and_n_tail(name, k):
    torch.set_num_threads(1)
    qt = quant.TYPES[name]
    torch.manual_seed(7)
    x = torch.randn(max(TILE_T), k)
    for n in TILE_N:
        blocks = random_blocks(name, n, k, seed=n)
        bt = torch.from_numpy(blocks)
        w = gguf_dequant(name, blocks, k)
        singles = torch.cat([quant.qmatmul(x[i : i + 1], bt, qt, k) for i in range(x.shape[0])])
        assert singles.shape == (x.shape[0], n)
        ref = emulated(x, w)
        assert ((singles.double() - ref).norm() / ref.norm()).item() <= 1e-5, n
        exact = x.double() @ w.double().T
        assert ((singles.double() - exact).norm() / exact.norm()).item() <= 1.5e-2, n
        for t in TILE_T:
            assert torch.equal(quant.qmatmul(x[:t], bt, qt, k), singles[:t]), (n, t)
        # activation rows in another order give the same rows (no dependence on a row's place in a tile)
        perm = torch.randperm(x.shape[0])
        assert torch.equal(quant.qmatmul(x[perm], bt, qt, k), singles[perm]), n


def _extreme_blocks(name: str, n: int, k: int, high: bool) -> np.ndarray:
    """Rows whose every weight code has the largest magnitude the format allows (``high``: the largest
    unsigned code, else the most negative weight), with random finite scales."""
    blocks = random_blocks(name, n, k, seed=11)
    values, nbytes = quant.BLOCKS[quant.TYPES[name]]
    b = blocks.reshape(-1, nbytes)
    if name == "Q4_1":
        b[:, 4:20] = 0xFF  # q = 15
    elif name == "Q5_0":
        b[:, 2:22] = 0xFF if high else 0x00  # q = 31 (w = 15) or q = 0 (w = -16)
    elif name == "Q8_0":
        b[:, 2:34] = 0x7F if high else 0x80  # 127 or -128
    elif name == "Q4_K":
        b[:, 4:16] = 0xFF  # scales and mins 63
        b[:, 16:144] = 0xFF  # q = 15
    else:  # Q6_K: q = 63 (w = 31) or q = 0 (w = -32)
        b[:, 0:192] = 0xFF if high else 0x00
    return b.reshape(n, -1)


@pytest.mark.parametrize("name,k", FORMATS)
@pytest.mark.parametrize("high", [True, False])
def test_extreme_codes_do_not_overflow_the_integer_sums(name, k, high):
    """Activation codes ±127 against the largest weight codes: the int16 partial sums of the tiles are at
    their bound (e.g. 8 x 31 x 127 for Q5_0), and must still give the exact integer dot."""
    n = 7
    blocks = _extreme_blocks(name, n, k, high)
    w = gguf_dequant(name, blocks, k)
    qt = quant.TYPES[name]
    signs = torch.tensor([1.0, -1.0]).repeat(3)
    x = signs[:, None] * torch.ones(6, k)  # every code +127 or -127
    x[4] = torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0)  # alternating
    x[5] = -x[4]
    y = quant.qmatmul(x, torch.from_numpy(blocks), qt, k)
    ref = emulated(x, w)
    assert ((y.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max().item() <= 1e-5
    rows = torch.cat([quant.qmatmul(x[i : i + 1], torch.from_numpy(blocks), qt, k) for i in range(6)])
    assert torch.equal(y, rows)
