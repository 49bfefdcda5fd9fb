"""The Triton paged decode kernel (single pass and split-KV) and the dispatcher.

Runs under the Triton interpreter on CPU. Constraint: ``TRITON_INTERPRET=1`` must be in the environment
before the first ``import triton`` of the pytest process, because ``triton.jit`` fixes, at decoration
time, whether triton's own library functions (``tl.sum``, ``tl.max``, ...) are interpretable. This module
sets it at its top, before anything imports triton; ``omniduplex.kernels`` imports triton lazily, on the
first kernel call, so earlier test modules importing ``omniduplex.kernels`` are harmless. If some earlier
test imports triton itself (e.g. through ``torch.compile``), the kernel raises a RuntimeError saying so;
the fix is to set the variable at the top of ``tests/conftest.py``. With ``TRITON_INTERPRET=0`` exported
and CUDA present, the same tests run compiled on the GPU.

The expected output is ``paged_attention_torch`` on float64 copies of the inputs; that reference is
itself checked against a naive per-sequence loop in ``test_paged_attention_ref.py``.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from omniduplex.kernels import attention  # noqa: E402
from omniduplex.kernels.paged_attention_ref import paged_attention_torch, write_kv_cache  # noqa: E402
from omniduplex.kernels.paged_decode_config import (  # noqa: E402
    DecodeConfig,
    choose_config,
    choose_num_splits,
    split_workspace_numel,
)

BLOCK = 16
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@pytest.fixture(scope="module")
def decode():
    """The kernel entry point; skips only when triton (or, uninterpreted, a GPU) is really missing."""
    pytest.importorskip("triton")
    if DEVICE == "cpu" and not INTERPRET:
        pytest.skip("TRITON_INTERPRET is not 1 and there is no CUDA device")
    from omniduplex.kernels import paged_decode_attention as module

    return module.paged_decode_attention_triton


def decode_case(seq_lens, num_q_heads, num_kv_heads, head_dim, dtype, seed, unwritten=1e4, block=BLOCK):
    """Decode batch (one query per sequence) over blocks handed out in a random permutation; unused
    block-table entries are garbage and never-written cache rows hold ``unwritten``-scaled noise (or NaN
    when ``unwritten`` is NaN)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.randint(-3, 10**6, (len(seq_lens), max(blocks_per_seq) + 1), generator=gen)
    block_tables = block_tables.to(torch.int32)
    shape = (num_blocks, block, num_kv_heads, head_dim)
    if unwritten != unwritten:  # NaN
        k_cache, v_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    else:
        k_cache = torch.empty(shape).uniform_(-unwritten, unwritten, generator=gen)
        v_cache = torch.empty(shape).uniform_(-unwritten, unwritten, generator=gen)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    used, slots = 0, []
    for s, n in enumerate(seq_lens):
        ids = perm[used : used + blocks_per_seq[s]]
        used += blocks_per_seq[s]
        block_tables[s, : len(ids)] = ids.to(torch.int32)
        slots += [int(ids[p // block]) * block + p % block for p in range(n)]
    k = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype)
    write_kv_cache(k_cache, v_cache, k, v, torch.tensor(slots, dtype=torch.int64))
    q = torch.randn(len(seq_lens), num_q_heads, head_dim, generator=gen).to(dtype)
    case = dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        scale=head_dim**-0.5,
    )
    return {name: t.to(DEVICE) if isinstance(t, torch.Tensor) else t for name, t in case.items()}


def expected(case):
    """float64 torch reference on CPU."""
    cpu = {n: t.cpu() if isinstance(t, torch.Tensor) else t for n, t in case.items()}
    num_seqs = cpu["q"].shape[0]
    return paged_attention_torch(
        cpu["q"].double(),
        cpu["k_cache"].double(),
        cpu["v_cache"].double(),
        cpu["block_tables"],
        cpu["seq_lens"],
        torch.arange(num_seqs + 1, dtype=torch.int32),
        cpu["scale"],
    )


def assert_matches(out, case):
    assert out.shape == case["q"].shape and out.dtype == case["q"].dtype
    tol = TOL[case["q"].dtype]
    torch.testing.assert_close(out.cpu().double(), expected(case), atol=tol, rtol=tol)


ODD = [1, 15, 16, 17, 33, 50, 0, 64, 65, 130]  # incl. an empty sequence and tile edges (tiles of 32)
SMALL = DecodeConfig(block_n=32, num_warps=4, num_stages=1)  # several tiles per sequence at small sizes


def run(decode, case, **kw):
    """Call the kernel into a NaN-poisoned ``out`` (every element must be written) and return ``out``."""
    out = torch.full_like(case["q"], float("nan"))
    assert decode(**case, out=out, **kw) is out
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_odd_lengths_shuffled_blocks(decode, dtype, num_splits):
    """fp16 runs the low-precision dots (cache dtype, fp32 accumulation) under the interpreter too."""
    case = decode_case(ODD, 8, 2, 32, dtype, seed=num_splits)
    assert_matches(run(decode, case, num_splits=num_splits, config=SMALL), case)


@pytest.mark.parametrize("ratio", [1, 2, 4, 8, 16])
def test_gqa_groups_single_and_split(decode, ratio):
    """Group 1 is MHA; 16 query heads per KV head fill BLOCK_G exactly."""
    case = decode_case([17, 70, 3], ratio * 2, 2, 16, torch.float32, seed=ratio)
    assert_matches(run(decode, case, num_splits=1, config=SMALL), case)
    assert_matches(run(decode, case, num_splits=2, config=SMALL), case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_default_tiles_real_head_size(decode, dtype):
    """The production config (head 128, 64-token tiles), 2 query heads per KV head, a 200-token sequence."""
    case = decode_case([200, 1, 64], 4, 2, 128, dtype, seed=3)
    assert_matches(run(decode, case, num_splits=1), case)
    assert_matches(run(decode, case, num_splits=4), case)


@pytest.mark.parametrize("head_dim", [24, 80])
def test_non_power_of_two_head_dim(decode, head_dim):
    case = decode_case([1, 31, 48], 6, 3, head_dim, torch.float16, seed=7)
    assert_matches(run(decode, case, num_splits=1, config=SMALL), case)
    assert_matches(run(decode, case, num_splits=4, config=SMALL), case)


def test_strided_q_and_block_size_32(decode):
    """``q`` a view of a fused qkv projection (row stride > heads * dim); 32-row KV blocks."""
    case = decode_case([40, 7, 100], 4, 2, 16, torch.float32, seed=8, block=32)
    qkv = torch.randn(3, 4 * 16 + 2 * 32, device=DEVICE)
    qkv[:, :64] = case["q"].reshape(3, 64)
    case["q"] = qkv[:, :64].view(3, 4, 16)
    assert case["q"].stride(0) == 128
    assert_matches(run(decode, case, num_splits=1, config=SMALL), case)
    assert_matches(run(decode, case, num_splits=2, config=SMALL), case)


def test_more_splits_than_tiles_and_empty_splits(decode):
    """Splits past a short sequence's end contribute nothing; split counts beyond the tiles are clamped."""
    case = decode_case([1, 65], 4, 4, 16, torch.float32, seed=2)
    assert_matches(run(decode, case, num_splits=64, config=SMALL), case)
    assert_matches(run(decode, case, num_splits=5, max_seq_len=65, config=SMALL), case)


def test_bound_below_the_real_length_is_still_exact(decode):
    """``max_seq_len`` sizes only the split count; each program splits its own sequence on the device."""
    case = decode_case([150, 20], 4, 2, 16, torch.float32, seed=12)
    assert_matches(run(decode, case, max_seq_len=16, config=SMALL), case)


def test_automatic_split_choice(decode):
    case = decode_case([97, 5], 4, 1, 16, torch.float32, seed=4)
    assert_matches(run(decode, case, config=SMALL), case)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_unwritten_nan_rows_are_masked(decode, num_splits):
    case = decode_case([17, 2, 33], 4, 2, 16, torch.float32, seed=5, unwritten=float("nan"))
    out = run(decode, case, num_splits=num_splits, config=SMALL)
    assert torch.isfinite(out).all()
    assert_matches(out, case)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_padding_rows_give_zeros(decode, num_splits):
    """Rows padded into a CUDA-graph bucket: ``seq_len`` 0 and a garbage block-table row."""
    case = decode_case([20, 1, 0, 0], 2, 1, 16, torch.float32, seed=6)
    case["block_tables"][2:] = torch.tensor([-7, 10**6, 3], dtype=torch.int32)
    out = run(decode, case, num_splits=num_splits, config=SMALL)
    assert torch.equal(out[2:].cpu(), torch.zeros_like(out[2:].cpu()))
    torch.testing.assert_close(out[:2].cpu().double(), expected(case)[:2], atol=1e-5, rtol=0)


def test_split_workspace_fully_written_and_reused(decode):
    """A NaN-poisoned caller workspace still gives the exact result (every partial read was written); the
    cached workspace is the same memory on every call of a shape (what a CUDA graph replays)."""
    case = decode_case([40, 9, 70], 4, 2, 16, torch.float32, seed=11)
    need = split_workspace_numel(3, 4, 3, 16)
    ws = torch.full((need + 5,), float("nan"), device=DEVICE)
    assert_matches(run(decode, case, num_splits=3, config=SMALL, workspace=ws), case)
    with pytest.raises(ValueError, match="workspace"):
        decode(**case, num_splits=3, config=SMALL, workspace=ws[: need - 1])
    from omniduplex.kernels import paged_decode_attention as module

    decode(**case, num_splits=3, config=SMALL)
    before = {k: v.data_ptr() for k, v in module._workspaces.items()}
    decode(**case, num_splits=3, config=SMALL)
    assert {k: v.data_ptr() for k, v in module._workspaces.items()} == before


def test_rejects_bad_inputs(decode):
    case = decode_case([5], 4, 2, 16, torch.float32, seed=0)
    with pytest.raises(ValueError):
        decode(**{**case, "q": case["q"][:, :3]})
    with pytest.raises(ValueError):
        decode(**{**case, "k_cache": case["k_cache"].double()})
    with pytest.raises(ValueError, match="out"):
        decode(**case, out=torch.empty(1, 4, 8, device=DEVICE))


def test_choose_num_splits():
    assert choose_num_splits(128, 8, 64, num_sms=132) == 1  # 1024 programs: the batch fills a wave (528)
    assert choose_num_splits(34, 8, 64, num_sms=132) == 1
    assert choose_num_splits(32, 8, 64, num_sms=132) == 2  # 528 // 256
    assert choose_num_splits(8, 8, 64, num_sms=132) == 8  # 512 programs: one wave
    assert choose_num_splits(1, 8, 64, num_sms=132) == 64  # capped by max_splits and by the tiles
    assert choose_num_splits(1, 8, 16, num_sms=132) == 16  # capped by the tiles of the bound
    assert choose_num_splits(1, 8, 0, num_sms=132) == 1


def test_choose_config():
    h100, a10, t4 = (9, 0), (8, 6), (7, 5)
    assert choose_config(128, 2, torch.bfloat16, h100) == DecodeConfig(64, 4, 3)  # 4 KV blocks a tile
    assert choose_config(128, 2, torch.bfloat16, a10) == DecodeConfig(64, 4, 2)
    assert choose_config(128, 2, torch.float32, h100) == DecodeConfig(32, 4, 3)
    assert choose_config(64, 4, torch.float16, t4) == DecodeConfig(128, 4, 1)
    assert choose_config(96, 1, torch.bfloat16, None) == DecodeConfig(64, 4, 1)  # padded to 128
    assert choose_config(256, 8, torch.bfloat16, h100).block_n == 32
    assert choose_config(64, 64, torch.bfloat16, h100).block_n == 64  # 64-row score tile: halved


def mixed_case(dtype=torch.float32):
    """Dispatcher input: a decode case plus its ``query_start_loc``."""
    case = decode_case([9, 33, 16], 4, 2, 16, dtype, seed=9)
    case["query_start_loc"] = torch.arange(4, dtype=torch.int32, device=DEVICE)
    return case


def test_dispatcher_forced_triton_decode(decode, monkeypatch):
    calls = []
    real = attention.paged_decode_attention_triton
    monkeypatch.setattr(
        attention, "paged_decode_attention_triton", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    monkeypatch.setenv(attention.BACKEND_ENV, "triton")
    case = mixed_case()
    assert_matches(attention.paged_attention(**case), case)
    assert_matches(attention.paged_attention(**case, max_query_len=1, max_seq_len=33), case)
    host = case["seq_lens"].tolist()  # the engine's eager steps pass the real lengths on: a planned split-KV
    seen = []
    monkeypatch.setattr(
        attention,
        "paged_decode_attention_triton",
        lambda *a, **k: seen.append(k.get("seq_lens_host")) or real(*a, **k),
    )
    assert_matches(attention.paged_attention(**case, max_query_len=1, seq_lens_host=host), case)
    assert len(calls) == 2 and seen == [host]
    # A batch with a prefill chunk has no Triton kernel: it goes to torch even when triton is forced.
    assert attention.select_backend(torch.device(DEVICE), decode_only=False) == "torch"


def test_dispatcher_keeps_other_dtypes_on_torch(decode, monkeypatch):
    """float64 (no Triton kernel for it) goes to the torch path even with triton forced."""
    calls = []
    monkeypatch.setattr(attention, "paged_decode_attention_triton", lambda *a, **k: calls.append(1))
    monkeypatch.setenv(attention.BACKEND_ENV, "triton")
    case = mixed_case()
    for name in ("q", "k_cache", "v_cache"):
        case[name] = case[name].double()
    out = attention.paged_attention(**case, max_query_len=1)
    assert calls == [] and out.dtype == torch.float64
    torch.testing.assert_close(out.cpu(), expected(case))


def test_dispatcher_torch_paths(monkeypatch):
    case = mixed_case()
    monkeypatch.setenv(attention.BACKEND_ENV, "torch")
    assert attention.select_backend(torch.device("cuda"), decode_only=True) == "torch"
    assert_matches(attention.paged_attention(**case, is_decode_only=True), case)
    monkeypatch.delenv(attention.BACKEND_ENV)
    monkeypatch.setenv("OMNIDUPLEX_CPU_OPS", "0")  # else our C++ decode kernel where loaded (test_cpu_ops)
    assert attention.select_backend(torch.device("cpu"), decode_only=True) == "torch"
    monkeypatch.setenv(attention.BACKEND_ENV, "cuda-graphs")
    with pytest.raises(ValueError):
        attention.select_backend(torch.device("cpu"), decode_only=True)


def test_dispatcher_refuses_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv(attention.BACKEND_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if attention.HAS_TRITON:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            attention.select_backend(torch.device("cpu"), decode_only=True)
    assert attention.select_backend(torch.device("cpu"), decode_only=False) == "torch"


def test_imports_and_falls_back_without_triton():
    """With triton unimportable the package still imports, the dispatcher runs the torch path, and the
    kernel raises a clear error."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import torch
        from omniduplex import kernels
        assert not kernels.HAS_TRITON
        q = torch.randn(2, 4, 16)
        cache = torch.randn(4, 16, 2, 16)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        sl = torch.tensor([20, 7], dtype=torch.int32)
        qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
        out = kernels.paged_attention(q, cache, cache, bt, sl, qsl, 0.25)
        assert out.shape == (2, 4, 16) and torch.isfinite(out).all()
        try:
            kernels.paged_decode_attention_triton(q, cache, cache, bt, sl, 0.25)
        except RuntimeError as e:
            assert "triton" in str(e)
        else:
            raise AssertionError("expected RuntimeError")
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != attention.BACKEND_ENV}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@settings(max_examples=6, deadline=None)
@given(
    seq_lens=st.lists(st.integers(0, 100), min_size=1, max_size=4),
    num_kv_heads=st.sampled_from([1, 2]),
    ratio=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 40, 64]),
    num_splits=st.sampled_from([1, 2, 3]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_random_decode_batches(decode, seq_lens, num_kv_heads, ratio, head_dim, num_splits, dtype, seed):
    case = decode_case(seq_lens, num_kv_heads * ratio, num_kv_heads, head_dim, dtype, seed)
    assert_matches(run(decode, case, num_splits=num_splits, config=SMALL), case)
